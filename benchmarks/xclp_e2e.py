"""XCLP end to end over localhost gRPC with TLS (real processes) vs the same protocol in one process.

3 parties × 599 rows of sklearn's digits (all 1797 rows; label-skewed: each class spread over the
parties by Dirichlet(0.5) proportions), 10 % of each party's rows labeled, L = 1024, 2048-bit
Paillier keys, k = 10, α = 0.99, p = 3, one-hot labels. A coordinator process (`xclp-server serve`,
TLS with a throwaway dev CA) and three `xclp-client run` processes (Paillier pool sized to the
cores) run the job; then `run_xclp_inprocess` runs the same protocol on the same data and the same
common seed (obtained through the parties' `--debug-dump-seed` test hook, so XCLP_TESTING=1 is set
for them) with a process pool.

Reported (last stdout line, JSON): total_seconds (wall, party processes started -> all exited:
includes interpreter start, Paillier key generation, join and seed), protocol_seconds (the
coordinator's step durations from intra_hamming to rowsums), steps (per-step seconds), bytes_total
(every payload byte in, relayed and sent by the coordinator), in_process_seconds (the in-process
run without its key generation: the same steps), transport_overhead_ratio = protocol_seconds /
in_process_seconds (goal <= 1.3), accuracy (xclp, per_client_lp on the unlabeled rows) and
whether the networked predictions equal the in-process ones.

Usage: python benchmarks/xclp_e2e.py [--quick | --smoke]   (--quick: 3 × 150 rows, L = 256, 1024-bit test keys)
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from _data import load_digits_data
from _service import deployment, run_command, serve

from xclp.baselines import per_client_lp
from xclp.crypto.pool import process_pool
from xclp.graph import GraphParams
from xclp.seeding import public_rng
from xclp.simulation import run_xclp_inprocess

PARTIES = ("a", "b", "c")
N_CLASSES = 10
GRAPH = GraphParams(k=10, alpha=0.99, power=3)
PROTOCOL_STEPS = ("intra_hamming", "secure_hamming", "labeled_sets", "graph", "rowsums")


def say(message: str) -> None:
    print(f"xclp_e2e: {message}", file=sys.stderr, flush=True)


def split(y: np.ndarray, rows: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Equal-size label-skewed parties: row by row, a party drawn by its class's Dirichlet(0.5) weights
    among the parties that still have room."""
    weights = {int(c): rng.dirichlet(np.full(len(PARTIES), 0.5)) for c in np.unique(y)}
    parts: list[list[int]] = [[] for _ in PARTIES]
    for i in rng.permutation(y.size)[: rows * len(PARTIES)]:
        room = np.array([len(p) < rows for p in parts], dtype=float)
        w = weights[int(y[i])] * room
        w = w / w.sum() if w.sum() > 0 else room / room.sum()
        parts[int(rng.choice(len(PARTIES), p=w))].append(int(i))
    return [np.array(sorted(p), dtype=np.int64) for p in parts]


def write_party_csv(path: Path, X: np.ndarray, y: np.ndarray) -> None:
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh, lineterminator="\n")
        w.writerow(["row_id", *(f"px{k}" for k in range(X.shape[1])), "label"])
        for i, (row, label) in enumerate(zip(X, y)):
            w.writerow([f"r{i}", *(repr(float(v)) for v in row), "" if label < 0 else int(label)])


def job_toml(job_id: str, lsh_bits: int, key_bits: int, deadlines: str = "") -> str:
    """The benchmark's XCLP job file (`deadlines`: more lines of its [deadlines] table)."""
    return (f'job_id = "{job_id}"\ntype = "xclp"\nexpected_parties = ["a", "b", "c"]\nsummary = "summary.json"\n'
            f"[deadlines]\njoin_seconds = 300\nstep_seconds = 900\n{deadlines}"
            f"[params]\nn_classes = {N_CLASSES}\nlsh_bits = {lsh_bits}\nk = {GRAPH.k}\nalpha = {GRAPH.alpha}\n"
            f"power = {GRAPH.power}\nkey_bits = {key_bits}\n"
            + ("insecure_test_keys = true\n" if key_bits < 2048 else ""))


def read_labels(path: Path) -> np.ndarray:
    with open(path, newline="") as fh:
        return np.array([int(r["label"]) for r in csv.DictReader(fh)], dtype=np.int64)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="3 x 150 rows, L = 256, 1024-bit test keys")
    ap.add_argument("--smoke", action="store_true",
                    help="the smallest run through every part, for CI: proves the benchmark runs; "
                    "its figures mean nothing")
    args = ap.parse_args()
    rows, lsh_bits, key_bits = ((60, 128, 512) if args.smoke else (150, 256, 1024) if args.quick
                                else (599, 1024, 2048))
    insecure = key_bits < 2048

    X, y = load_digits_data()
    rng = public_rng(7, "benchmark/xclp-e2e/split")
    clients = split(y, rows, rng)
    partial = {}
    for p, idx in zip(PARTIES, clients):
        labels = np.full(idx.size, -1, dtype=np.int64)
        chosen = rng.choice(idx.size, size=max(1, round(0.1 * idx.size)), replace=False)
        labels[chosen] = y[idx][chosen]
        partial[p] = labels

    work = deployment("xclp-e2e-", PARTIES)
    for p, idx in zip(PARTIES, clients):
        write_party_csv(work / f"{p}.csv", X[idx], partial[p])
    (work / "job.toml").write_text(job_toml("e2e", lsh_bits, key_bits))
    env = {**os.environ, "XCLP_TESTING": "1", "PYTHONUNBUFFERED": "1"}
    server, port = serve(work, env)
    say(f"{len(PARTIES)} parties x {rows} rows, L = {lsh_bits}, {key_bits}-bit keys; work dir {work}")
    started = time.perf_counter()
    procs = []
    for p in PARTIES:
        cmd = run_command(work, port, "e2e", p, "--data", str(work / f"{p}.csv"), "--id-column", "row_id",
                          "--paillier-bits", str(key_bits), "--out", str(work / "out" / p),
                          "--debug-dump-seed", str(work / f"{p}.seed"),
                          *(["--insecure-test-keys"] if insecure else []))
        procs.append(subprocess.Popen(cmd, stderr=open(work / f"{p}.log", "w"), env=env))
    codes = [proc.wait() for proc in procs]
    total = time.perf_counter() - started
    server.wait(60)
    if any(codes):
        raise SystemExit(f"a party failed ({codes}); logs in {work}")
    summary = json.loads((work / "summary.json").read_text())
    steps = {name: summary["steps"][name]["seconds"] for name in PROTOCOL_STEPS if name in summary["steps"]}
    protocol = sum(steps.values())
    say(f"networked: {total:.1f}s wall, protocol steps {protocol:.1f}s: {steps}")

    seed = (work / "a.seed").read_bytes()
    say("in-process run of the same protocol, same data and seed ...")
    with process_pool() as pool:
        inproc = run_xclp_inprocess({p: (X[idx], partial[p]) for p, idx in zip(PARTIES, clients)}, N_CLASSES,
                                    seed=seed, L=lsh_bits, key_bits=key_bits, params=GRAPH, executor=pool,
                                    insecure_test_keys=insecure)
    in_process = inproc.total_seconds - inproc.seconds.get("setup", 0.0)
    say(f"in-process: {in_process:.1f}s without key generation: {inproc.seconds}")

    xclp_right = per_client_right = unlabeled_total = 0
    same = True
    for p, idx in zip(PARTIES, clients):
        truth, unlabeled = y[idx], partial[p] < 0
        predicted = read_labels(work / "out" / p / "predictions.csv")
        same &= bool(np.array_equal(predicted, inproc.outputs[p].labels))
        alone = per_client_lp(X[idx], partial[p], N_CLASSES, GRAPH).labels
        xclp_right += int(np.sum(predicted[unlabeled] == truth[unlabeled]))
        per_client_right += int(np.sum(alone[unlabeled] == truth[unlabeled]))
        unlabeled_total += int(unlabeled.sum())
    print(json.dumps({
        "parties": len(PARTIES), "rows_per_party": rows, "lsh_bits": lsh_bits, "key_bits": key_bits,
        "cores": len(os.sched_getaffinity(0)),
        "total_seconds": round(total, 3), "protocol_seconds": round(protocol, 3),
        "steps": {k: round(v, 3) for k, v in steps.items()}, "bytes_total": summary["bytes_total"],
        "in_process_seconds": round(in_process, 3),
        "in_process_steps": {k: round(v, 3) for k, v in inproc.seconds.items()},
        "transport_overhead_ratio": round(protocol / in_process, 3),
        "accuracy": {"xclp": round(xclp_right / unlabeled_total, 4),
                     "per_client_lp": round(per_client_right / unlabeled_total, 4)},
        "predictions_equal_in_process": same,
    }))


if __name__ == "__main__":
    main()
