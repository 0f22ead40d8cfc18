"""`benchmarks/fedavg_xclp.py --secure`: FedAvg+XCLP through the real CLIs, timed per round.

Three institutions with ~300 digits rows each (Dirichlet(0.3) label skew, 10 % labeled), the
coordinator and the parties as real processes over gRPC+TLS on localhost (xclp.demo's harness),
2048-bit Paillier keys (1024 with --quick), L = 1024. Per round: the coordinator's wall time (from
its log), and each party's seconds on pseudo-labels (the round's XCLP run: embedding,
SecureHamming, graph, SecureRowSums) and on local training (from its progress lines).
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from _data import dirichlet_split, load_digits_data, subsample_labels, write_party_csv

from xclp.client.models import ModelFile
from xclp.demo import JOB_ID, PARTIES, DemoOptions, run_processes, setup
from xclp.seeding import public_rng

ROUND_LINE = re.compile(r"round (\d+): pseudo-labels in ([\d.]+)s, trained on (\d+) rows in ([\d.]+)s")
COORD_LINE = re.compile(r"round (\d+): model updated from (\d+) parties \((\d+) rows\) in ([\d.]+)s")


def job_text(options: DemoOptions, rounds: int) -> str:
    parties = ", ".join(f'"{p}"' for p in PARTIES)
    insecure = "insecure_test_keys = true\n" if options.insecure_test_keys else ""
    return (f'job_id = "{JOB_ID}"\ntype = "fedavg"\nexpected_parties = [{parties}]\nmin_parties = 3\n'
            f"[deadlines]\njoin_seconds = 120\nstep_seconds = 900\n[params]\nn_classes = 10\nhidden = [64]\n"
            f'rounds = {rounds}\nlocal_epochs = 5\nbatch_size = 32\nlearning_rate = 0.05\nmomentum = 0.9\n'
            f'pseudo_label = "xclp"\nstandardise = true\nlsh_bits = {options.lsh_bits}\nk = 10\n'
            f"key_bits = {options.key_bits}\n{insecure}")


def secure_run(args: argparse.Namespace) -> dict[str, object]:
    rounds = args.rounds or 3
    smoke = getattr(args, "smoke", False)
    options = DemoOptions(key_bits=1024 if args.quick else 2048, insecure_test_keys=args.quick,
                          lsh_bits=256 if smoke else 1024)
    X, y = load_digits_data()
    rng = public_rng(0, "benchmark/fedavg-xclp/secure")
    rows = rng.permutation(len(y))[:400 if smoke else 1200]
    test, train = rows[:100 if smoke else 300], rows[100 if smoke else 300:]
    clients = dirichlet_split(y[train], 3, 0.3, rng)
    partial = subsample_labels(y[train], clients, 0.1, rng)
    work = Path(tempfile.mkdtemp(prefix="xclp-fedavg-bench-"))
    try:
        data = work / "data"
        data.mkdir()
        for party, part in zip(PARTIES, clients):
            write_party_csv(data / f"{party}.csv", party, X[train][part], partial[part])
        options = DemoOptions(options.key_bits, options.insecure_test_keys, options.lsh_bits, data)
        setup(work, options, job_text(options, rounds))
        lines: dict[str, list[str]] = {}
        procs: list = []
        started = time.perf_counter()
        try:
            run_processes(work, options, procs, lines)
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
        total = time.perf_counter() - started
        per_round = [float(m.group(4)) for m in COORD_LINE.finditer((work / "coordinator.log").read_text())]
        pseudo = {t: [] for t in range(rounds)}
        training = {t: [] for t in range(rounds)}
        for party_lines in lines.values():
            for line in party_lines:
                m = ROUND_LINE.search(line)
                if m:
                    pseudo[int(m.group(1))].append(float(m.group(2)))
                    training[int(m.group(1))].append(float(m.group(4)))
        model = ModelFile.load(work / "out" / PARTIES[0])  # --out names the model file
        assert model.scaling is not None
        accuracy = round(float(np.mean(model.loaded().network.predict(model.scaling.apply(X[test])) == y[test])), 4)
        table = [{"round": t, "seconds": per_round[t] if t < len(per_round) else None,
                  "xclp_seconds_max": max(pseudo[t], default=None), "train_seconds_max": max(training[t], default=None)}
                 for t in range(rounds)]
        for row in table:
            print(f"round {row['round']}: {row['seconds']} s in all; XCLP (slowest party) {row['xclp_seconds_max']} s, "
                  f"training (slowest party) {row['train_seconds_max']} s", file=sys.stderr)
        return {"mode": "secure", "key_bits": options.key_bits, "parties": 3,
                "rows_per_party": [int(len(c)) for c in clients], "rounds": rounds,
                "seconds_per_round": round(float(np.mean(per_round)), 2) if per_round else None,
                "xclp_seconds_per_round": round(float(np.mean([r["xclp_seconds_max"] for r in table])), 2),
                "train_seconds_per_round": round(float(np.mean([r["train_seconds_max"] for r in table])), 2),
                "total_seconds": round(total, 1), "test_accuracy": accuracy, "per_round": table}
    finally:
        shutil.rmtree(work, ignore_errors=True)
