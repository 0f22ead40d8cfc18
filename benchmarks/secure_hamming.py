"""Packed SecureHamming vs the paper's literal per-bit protocol, and vs the CRT-decryption floor.

Full run: A and B with 1000 vectors each of L = 1024 bits, 2048-bit key; `--quick`: 200 vectors,
1024-bit key (test size). Phases of the packed protocol are timed on one process pool sized to
the cores; the literal protocol is timed per operation on a sample and extrapolated (assuming
perfect scaling over the same number of workers, which flatters it). The floor is CRT decryption
alone of the same number of ciphertexts on the same pool (twice, averaged; see main). Progress goes to stderr; the last
stdout line is one JSON object.

`--workers` is the pool's size (default: the cores), or a Dask scheduler (docs/design.md §10.4):
`tls://host:8786` (TLS configured the Dask way, docs/cluster.md), or `local` to start one here over
mutual TLS with a throwaway CA and as many single-threaded worker processes as cores. With a scheduler the
packed protocol also runs on the cluster, alternating with a process pool of as many processes as
the cluster has threads (pool, cluster, pool, cluster), and the JSON's "cluster" reports both
times, their ratio and the payload bytes moved to and from the workers per pair (task arguments
and results: ciphertexts, codes, keys, masks).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the oracles live in tests/, not in the package

from tests.oracles.decryption_floor import decrypt_all
from tests.oracles.literal_hamming import literal_decrypt, literal_encrypt_bits, literal_evaluate, literal_unmask
from xclp.crypto.paillier import PaillierKeypair
from xclp.crypto.pool import default_workers, process_pool, run_tasks
from xclp.crypto.secure_hamming import (
    SlotLayout,
    choose_group_bits,
    decrypt,
    encrypt_bit_slices,
    evaluate,
    unmask_distances,
)
from xclp.seeding import public_rng


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def cpu_seconds(pool: ProcessPoolExecutor) -> float:
    """CPU seconds used so far by this process and the pool's workers (Linux /proc).

    The machine is shared, so wall time swings with other people's load; CPU time swings much
    less. Reads the pool's private worker table: acceptable in a benchmark, never in the library.
    """
    total = time.process_time()
    tick = os.sysconf("SC_CLK_TCK")
    for pid in list(getattr(pool, "_processes", {}) or {}):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / tick  # utime, stime
    return total


def random_codes(rng: np.random.Generator, n: int, L: int) -> np.ndarray:
    return rng.integers(0, 2**64, size=(n, L // 64), dtype=np.uint64, endpoint=False)


def plaintext_hamming(codes_B: np.ndarray, codes_A: np.ndarray) -> np.ndarray:
    out = np.empty((len(codes_B), len(codes_A)), dtype=np.int64)
    for i, x in enumerate(codes_B):
        out[i] = np.unpackbits((codes_A ^ x).view(np.uint8), axis=1).sum(axis=1)
    return out


def time_literal(keypair: PaillierKeypair, codes_A: np.ndarray, codes_B: np.ndarray, layout: SlotLayout,
                 samples: int) -> dict[str, float]:
    """Wall and CPU seconds per literal operation on one core: bit encryption, pair evaluation, pair decryption."""
    pub, priv, L = keypair.public.to_phe(), keypair.to_phe(), layout.L
    out: dict[str, float] = {}
    w0, c0 = time.perf_counter(), time.process_time()
    enc = literal_encrypt_bits(pub, codes_A[:1], L)  # L bit encryptions
    out["encrypt_bit"], out["encrypt_bit_cpu"] = (time.perf_counter() - w0) / L, (time.process_time() - c0) / L
    w0, c0 = time.perf_counter(), time.process_time()
    evaluated, r = literal_evaluate(pub, enc, codes_B[:samples], L)
    out["evaluate_pair"] = (time.perf_counter() - w0) / samples
    out["evaluate_pair_cpu"] = (time.process_time() - c0) / samples
    w0, c0 = time.perf_counter(), time.process_time()
    t = literal_decrypt(priv, evaluated)
    out["decrypt_pair"] = (time.perf_counter() - w0) / samples
    out["decrypt_pair_cpu"] = (time.process_time() - c0) / samples
    expected = plaintext_hamming(codes_B[:samples], codes_A[:1])
    assert (literal_unmask(t, r, pub.n, L) == expected).all(), "literal protocol disagrees with plaintext"
    return out


def payload(value: object) -> int:
    """Bytes of a task's argument or result as data: bytes, arrays, integers (ciphertexts, masks,
    key parts), and containers of them; anything else counts 0."""
    if isinstance(value, bytes | bytearray | memoryview):
        return len(value)
    if isinstance(value, np.ndarray):
        return value.nbytes
    if isinstance(value, list | tuple):
        return sum(payload(v) for v in value)
    if isinstance(value, int) or type(value).__name__ == "mpz":
        return (int(value).bit_length() + 7) // 8
    return 0


def packed(keypair: PaillierKeypair, codes_A: np.ndarray, codes_B: np.ndarray, layout: SlotLayout,
           executor: object) -> tuple[float, np.ndarray]:
    """One packed SecureHamming of the pair on `executor`: its seconds and the distances."""
    t0 = time.perf_counter()
    slices = encrypt_bit_slices(keypair, codes_A, layout, executor)
    evaluated, r = evaluate(keypair.public, slices, codes_B, executor)
    t = decrypt(keypair, evaluated, layout, len(codes_A), executor)
    seconds = time.perf_counter() - t0
    return seconds, unmask_distances(t, r, keypair.public, layout, len(codes_A), len(codes_B))


def on_cluster(scheduler: str, keypair: PaillierKeypair, codes_A: np.ndarray, codes_B: np.ndarray,
               layout: SlotLayout, expected: np.ndarray) -> dict[str, object]:
    """The packed protocol on a Dask cluster against a process pool as large as the cluster's
    threads, alternating, with the payload bytes moved to and from the workers."""
    from xclp.workers import DaskWorkers

    class Counted(DaskWorkers):
        sent = received = 0

        def share(self, value):  # type: ignore[no-untyped-def]
            Counted.sent += payload(value)
            return super().share(value)

        def submit(self, fn, /, *args, **kwargs):  # type: ignore[no-untyped-def]
            Counted.sent += payload(args)
            future = super().submit(fn, *args, **kwargs)
            future.add_done_callback(lambda f: setattr(Counted, "received", Counted.received
                                                       + (payload(f.result()) if not f.exception() else 0)))
            return future

    with contextlib.ExitStack() as stack:
        if scheduler == "local":
            from tests.dask_cluster import cluster as local_cluster

            tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="xclp-dask-")))
            scheduler = stack.enter_context(local_cluster(tmp, default_workers())).address  # and its TLS config
        counted = stack.enter_context(Counted.connect(scheduler))
        threads = counted.threads()
        log(counted.describe())
        times: dict[str, list[float]] = {"pool": [], "cluster": []}
        correct = True
        with process_pool(threads) as pool:
            decrypt_all(keypair, b"", 1, pool)
            run_tasks(len, [(b"",)] * threads, counted)  # the workers' imports, outside any timed run
            Counted.sent = Counted.received = 0
            for round_ in range(2):
                for name, executor in (("pool", pool), ("cluster", counted)):
                    seconds, H = packed(keypair, codes_A, codes_B, layout, executor)
                    correct &= bool(np.array_equal(H, expected))
                    times[name].append(seconds)
                    log(f"round {round_}: {name} {seconds:.2f}s")
        sent, received = Counted.sent // 2, Counted.received // 2  # per pair: two rounds ran
    pool_s, cluster_s = (sum(v) / len(v) for v in (times["pool"], times["cluster"]))
    return {"scheduler": "local" if scheduler.startswith("tls://127.0.0.1") else "given", "threads": threads,
            "correct": correct, "pool_seconds": [round(x, 3) for x in times["pool"]],
            "cluster_seconds": [round(x, 3) for x in times["cluster"]],
            "overhead_ratio": round(cluster_s / pool_s, 3),
            "bytes_to_workers_per_pair": sent, "bytes_from_workers_per_pair": received}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="200 vectors, 1024-bit (test-size) key")
    parser.add_argument("--smoke", action="store_true",
                        help="the smallest run through every part, for CI: proves the benchmark runs; "
                        "its figures mean nothing")
    parser.add_argument("--n", type=int, help="vectors per side (default 1000, quick 200)")
    parser.add_argument("--L", type=int, default=1024)
    parser.add_argument("--bits", type=int, help="modulus bits (default 2048, quick 1024)")
    parser.add_argument("--workers", default=str(default_workers()),
                        help="pool processes (default: the cores), or a Dask scheduler: tls://host:8786 or local")
    parser.add_argument("--literal-samples", type=int, default=4)
    args = parser.parse_args()
    scheduler = None if args.workers.isdigit() else args.workers
    args.workers = int(args.workers) if scheduler is None else default_workers()
    n = args.n or (20 if args.smoke else 200 if args.quick else 1000)
    bits = args.bits or (512 if args.smoke else 1024 if args.quick else 2048)
    if args.smoke:
        args.L, args.literal_samples = 128, 1

    rng = public_rng(2024, "benchmarks/secure_hamming")
    codes_A, codes_B = random_codes(rng, n, args.L), random_codes(rng, n, args.L)
    t0 = time.perf_counter()
    keypair = PaillierKeypair.generate(bits, allow_insecure_test_size=bits < 2048)
    keygen = time.perf_counter() - t0
    layout = SlotLayout.for_key(keypair.public, args.L)
    log(f"n={n} L={args.L} |N|={bits} w={layout.width} K={layout.slots} workers={args.workers} keygen={keygen:.2f}s")

    phases: dict[str, float] = {}
    phases_cpu: dict[str, float] = {}
    floors: list[float] = []
    floors_cpu: list[float] = []
    with process_pool(args.workers) as pool:
        # The machine is shared: the floor is measured twice and averaged so load drift does not
        # favour either side — between A's and B's phases on A's ciphertexts (same count as B's
        # output), and at the end on B's ciphertexts.
        decrypt_all(keypair, b"", 1, pool)  # start the workers outside any timed phase
        width, count = keypair.public.ciphertext_bytes, layout.batches(n) * n
        t0, c0 = time.perf_counter(), cpu_seconds(pool)
        slices = encrypt_bit_slices(keypair, codes_A, layout, pool)
        phases["a_encrypt"], phases_cpu["a_encrypt"] = time.perf_counter() - t0, cpu_seconds(pool) - c0
        log(f"A encrypt: {phases['a_encrypt']:.2f}s")
        sample = (slices.ciphertexts * -(-count * width // len(slices.ciphertexts)))[: count * width]
        t0, c0 = time.perf_counter(), cpu_seconds(pool)
        decrypt_all(keypair, sample, layout.batches(n), pool)
        floors.append(time.perf_counter() - t0)
        floors_cpu.append(cpu_seconds(pool) - c0)
        log(f"decrypt floor (A's ciphertexts): {floors[-1]:.2f}s")
        t0, c0 = time.perf_counter(), cpu_seconds(pool)
        evaluated, r = evaluate(keypair.public, slices, codes_B, pool)
        phases["b_evaluate"], phases_cpu["b_evaluate"] = time.perf_counter() - t0, cpu_seconds(pool) - c0
        log(f"B evaluate: {phases['b_evaluate']:.2f}s")
        t0, c0 = time.perf_counter(), cpu_seconds(pool)
        t = decrypt(keypair, evaluated, layout, n, pool)
        phases["a_decrypt"], phases_cpu["a_decrypt"] = time.perf_counter() - t0, cpu_seconds(pool) - c0
        log(f"A decrypt: {phases['a_decrypt']:.2f}s")
        t0, c0 = time.perf_counter(), cpu_seconds(pool)
        H = unmask_distances(t, r, keypair.public, layout, n, n)
        phases["unmask"], phases_cpu["unmask"] = time.perf_counter() - t0, cpu_seconds(pool) - c0
        t0, c0 = time.perf_counter(), cpu_seconds(pool)
        decrypt_all(keypair, evaluated.ciphertexts, layout.batches(n), pool)
        floors.append(time.perf_counter() - t0)
        floors_cpu.append(cpu_seconds(pool) - c0)
        log(f"decrypt floor (B's ciphertexts): {floors[-1]:.2f}s")
    floor, floor_cpu = sum(floors) / len(floors), sum(floors_cpu) / len(floors_cpu)
    correct = bool((plaintext_hamming(codes_B, codes_A) == H).all())
    optimised, optimised_cpu = sum(phases.values()), sum(phases_cpu.values())

    per_op = time_literal(keypair, codes_A, codes_B, layout, args.literal_samples)
    literal_single_core = (n * args.L * per_op["encrypt_bit"]
                           + n * n * (per_op["evaluate_pair"] + per_op["decrypt_pair"]))
    literal = literal_single_core / args.workers  # wall time if the literal protocol scaled perfectly
    literal_cpu_time = (n * args.L * per_op["encrypt_bit_cpu"]
                        + n * n * (per_op["evaluate_pair_cpu"] + per_op["decrypt_pair_cpu"]))
    log(f"literal per op: {per_op}; extrapolated {literal_single_core / 3600:.2f} single-core hours")

    cluster = None
    if scheduler is not None:
        cluster = on_cluster(scheduler, keypair, codes_A, codes_B, layout, H)
    print(json.dumps({  # wall-clock figures first (the targets), CPU figures as a noise check
        "benchmark": "secure_hamming",
        "quick": args.quick,
        "n_A": n, "n_B": n, "L": args.L, "modulus_bits": bits, "workers": args.workers,
        "slot_width": layout.width, "slots": layout.slots, "group_bits": choose_group_bits(args.L, n),
        "ciphertexts_a_to_b": layout.batches(n) * args.L, "ciphertexts_b_to_a": layout.batches(n) * n,
        "correct": correct,
        "keygen_seconds": round(keygen, 3),
        "phase_seconds": {k: round(v, 3) for k, v in phases.items()},
        "optimised_seconds": round(optimised, 3),
        "literal_seconds_per_op": {k: round(v, 6) for k, v in per_op.items()},
        "literal_single_core_seconds_extrapolated": round(literal_single_core, 1),
        "literal_seconds_extrapolated": round(literal, 1),
        "speedup": round(literal / optimised, 1),
        "phase_cpu_seconds": {k: round(v, 3) for k, v in phases_cpu.items()},
        "optimised_cpu_seconds": round(optimised_cpu, 3),
        "literal_cpu_seconds_extrapolated": round(literal_cpu_time, 1),
        "speedup_cpu": round(literal_cpu_time / optimised_cpu, 1),
        "decrypt_floor_cpu_seconds": round(floor_cpu, 3),
        "ratio_to_floor_cpu": round(optimised_cpu / floor_cpu, 3),
        "decrypt_floor_seconds": round(floor, 3),
        "decrypt_floor_runs": [round(f, 3) for f in floors],
        "ratio_to_floor": round(optimised / floor, 3),
        "distances_per_second": round(n * n / optimised, 1),
        "bytes_a_to_b": len(keypair.public.to_bytes()) + len(slices.to_bytes()),
        "bytes_b_to_a": len(evaluated.to_bytes()),
        "bytes_b_to_coordinator": len(r.data),
        "bytes_a_to_coordinator": len(t.data),
        **({"cluster": cluster} if cluster is not None else {}),
    }))


if __name__ == "__main__":
    main()
