"""XCLP through the CLIs, once clean and once with every party's connection cut in the middle of
SecureHamming: what a network fault costs.

3 parties of sklearn's digits, split and labeled as in xclp_e2e.py, a coordinator process
(`xclp-server serve`, TLS with a throwaway dev CA) and three `xclp-client run` processes. In the
faulty run the parties reach the coordinator through a TCP proxy (tests/proxy.py) that closes
every connection through it once SecureHamming has run for half as long as it took in the clean
run; the parties reconnect (the job's reconnect_seconds) and go on. Each run's predictions are
checked against the same protocol run in one process on that run's common seed (the two runs draw
different seeds, so their predictions differ from each other by design).

Reported (last stdout line, JSON): per run its wall seconds (party processes started -> all
exited), SecureHamming seconds and attempts, who was dropped, whether its predictions equal the
in-process run's; the cuts made; and wall_ratio = faulty / clean (goal <= 1.2).

What this does not cover yet: a party or the coordinator killed and restarted (resume from state
on disk).

Usage: python benchmarks/xclp_faults.py [--quick]   (--quick: 3 x 150 rows, L = 256, 1024-bit test keys)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
from _data import load_digits_data
from _service import deployment, run_command, serve
from xclp_e2e import GRAPH, N_CLASSES, PARTIES, job_toml, read_labels, split, write_party_csv

from xclp.crypto.pool import process_pool
from xclp.seeding import public_rng
from xclp.simulation import run_xclp_inprocess

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.proxy import Proxy  # the checkout's tests: the proxy the tests cut too


def say(message: str) -> None:
    print(f"xclp_faults: {message}", file=sys.stderr, flush=True)


def one_run(name: str, data: dict[str, tuple[np.ndarray, np.ndarray]], lsh_bits: int, key_bits: int,
            cut_after: float | None) -> dict[str, Any]:
    """A whole run through the CLIs; with `cut_after`, every connection is cut that many seconds
    into SecureHamming."""
    insecure = key_bits < 2048
    work = deployment(f"xclp-faults-{name}-", PARTIES)
    for p, (X, y) in data.items():
        write_party_csv(work / f"{p}.csv", X, y)
    (work / "job.toml").write_text(job_toml("faults", lsh_bits, key_bits, "reconnect_seconds = 60\n"))
    env = {**os.environ, "XCLP_TESTING": "1", "PYTHONUNBUFFERED": "1"}
    server, port = serve(work, env)
    proxy = Proxy(f"127.0.0.1:{port}") if cut_after is not None else None
    dial = int(proxy.address.rsplit(":", 1)[1]) if proxy is not None else port
    started = time.perf_counter()
    procs = [subprocess.Popen(run_command(work, dial, "faults", p, "--data", str(work / f"{p}.csv"),
                                          "--id-column", "row_id", "--paillier-bits", str(key_bits),
                                          "--out", str(work / "out" / p), "--debug-dump-seed", str(work / f"{p}.seed"),
                                          *(["--insecure-test-keys"] if insecure else [])),
                              stderr=open(work / f"{p}.log", "w"), env=env) for p in PARTIES]
    cut_at: list[float] = []
    if proxy is not None and cut_after is not None:
        threading.Thread(target=cut_in_secure_hamming, args=(work / "coordinator.log", proxy, cut_after, cut_at),
                         daemon=True).start()
    codes = [proc.wait() for proc in procs]
    wall = time.perf_counter() - started
    server.wait(60)
    if proxy is not None:
        proxy.close()
    if any(codes):
        raise SystemExit(f"{name}: a party failed ({codes}); logs in {work}")
    summary = json.loads((work / "summary.json").read_text())
    hamming = summary["steps"]["secure_hamming"]
    say(f"{name}: {wall:.1f}s wall, SecureHamming {hamming['seconds']:.1f}s in {hamming['rounds']} attempt(s)"
        + (f", connections cut {cut_at[0]:.1f}s into it" if cut_at else ""))
    seed = (work / "a.seed").read_bytes()
    with process_pool() as pool:
        inproc = run_xclp_inprocess(data, N_CLASSES, seed=seed, L=lsh_bits, key_bits=key_bits, params=GRAPH,
                                    executor=pool, insecure_test_keys=insecure)
    same = all(np.array_equal(read_labels(work / "out" / p / "predictions.csv"), inproc.outputs[p].labels)
               for p in PARTIES)
    reconnected = sum("reconnected to the coordinator" in (work / f"{p}.log").read_text() for p in PARTIES)
    return {"wall_seconds": round(wall, 3), "secure_hamming_seconds": round(hamming["seconds"], 3),
            "secure_hamming_attempts": hamming["rounds"], "dropped": summary.get("dropped", {}),
            "cut_seconds_into_secure_hamming": round(cut_at[0], 3) if cut_at else None,
            "parties_reconnected": reconnected, "predictions_equal_in_process": same}


def cut_in_secure_hamming(log: Path, proxy: Proxy, after: float, cut_at: list[float]) -> None:
    """Once the coordinator's log says SecureHamming started, wait `after` seconds and cut."""
    while "step secure_hamming attempt 0 started" not in log.read_text(errors="replace"):
        time.sleep(0.2)
    began = time.perf_counter()
    time.sleep(after)
    proxy.cut()
    cut_at.append(time.perf_counter() - began)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="3 x 150 rows, L = 256, 1024-bit test keys")
    args = ap.parse_args()
    rows, lsh_bits, key_bits = (150, 256, 1024) if args.quick else (599, 1024, 2048)
    X, y = load_digits_data()
    rng = public_rng(7, "benchmark/xclp-e2e/split")
    data = {}
    for p, idx in zip(PARTIES, split(y, rows, rng)):
        labels = np.full(idx.size, -1, dtype=np.int64)
        chosen = rng.choice(idx.size, size=max(1, round(0.1 * idx.size)), replace=False)
        labels[chosen] = y[idx][chosen]
        data[p] = (X[idx], labels)
    say(f"{len(PARTIES)} parties x {rows} rows, L = {lsh_bits}, {key_bits}-bit keys")
    clean = one_run("clean", data, lsh_bits, key_bits, None)
    cut = one_run("cut", data, lsh_bits, key_bits, clean["secure_hamming_seconds"] / 2)
    print(json.dumps({
        "parties": len(PARTIES), "rows_per_party": rows, "lsh_bits": lsh_bits, "key_bits": key_bits,
        "cores": len(os.sched_getaffinity(0)), "load_average_1min": round(os.getloadavg()[0], 2),
        "clean": clean, "connections_cut_mid_secure_hamming": cut,
        "wall_ratio": round(cut["wall_seconds"] / clean["wall_seconds"], 3),
    }))


if __name__ == "__main__":
    main()
