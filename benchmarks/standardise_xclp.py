"""XCLP through the CLIs on unscaled public tables, with and without federated standardisation.

Wine (178 rows, 13 features on scales from 0.1 to 1000) and breast cancer (569 rows, 30 features)
from scikit-learn's bundled copies, split over three institutions with a Dirichlet(0.5) label skew,
20 % of each institution's rows labeled, labels written as class names (the job declares
`classes`). Each run is the real thing: `xclp-server serve` and three `xclp-client run` processes
over TLS on localhost (xclp.demo's harness), once with the job as is and once with
`standardise = true`; accuracy is measured on every institution's unlabeled rows, pooled. The
job's common seed is drawn afresh by the parties in every run (it is secret), so the LSH and the
accuracy vary from run to run by a point or two.

Full run: 2048-bit Paillier keys, L = 1024; `--quick`: 1024-bit test keys. Progress on stderr;
the last stdout line is JSON.

Usage: python benchmarks/standardise_xclp.py [--quick | --smoke] [--seed S]
"""

from __future__ import annotations

import argparse
import csv
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _data import dirichlet_split, subsample_labels

from xclp.demo import PARTIES, DemoOptions, job_toml, run_processes, setup

LABELED = 0.2
SKEW = 0.5


def log(message: str) -> None:
    print(f"standardise_xclp: {message}", file=sys.stderr, flush=True)


def load(name: str) -> tuple[np.ndarray, np.ndarray, list[str], list[str]]:
    from sklearn import datasets  # benchmark-only dependency (extra "bench"), bundled files, no network

    bunch = datasets.load_wine() if name == "wine" else datasets.load_breast_cancer()
    names = [str(n) for n in bunch.target_names]
    return bunch.data.astype(np.float64), bunch.target.astype(np.int64), [str(f) for f in bunch.feature_names], names


def write_party(path: Path, X: np.ndarray, y: np.ndarray, features: list[str], names: list[str], prefix: str) -> None:
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["row_id", *features, "label"])
        for i, (row, label) in enumerate(zip(X, y)):
            w.writerow([f"{prefix}-{i}", *map(repr, row.tolist()), "" if label < 0 else names[label]])


def job_text(options: DemoOptions, names: list[str], standardise: bool) -> str:
    """The demo's XCLP job (k = 5, p = 3, one-hot labels) with the table's class names."""
    classes = ", ".join(f'"{n}"' for n in names)
    return job_toml(options, n_classes=len(names),
                    extra=f"classes = [{classes}]\nstandardise = {'true' if standardise else 'false'}\n")


def run_once(name: str, standardise: bool, options: DemoOptions, seed: int) -> dict:
    X, y, features, names = load(name)
    rng = np.random.default_rng(seed)
    clients = dirichlet_split(y, 3, SKEW, rng)
    y_partial = subsample_labels(y, clients, LABELED, rng)
    work = Path(tempfile.mkdtemp(prefix="xclp-bench-"))
    data = work / "data"
    data.mkdir()
    try:
        for party, rows in zip(PARTIES, clients):
            write_party(data / f"{party}.csv", X[rows], y_partial[rows], features, names, party)
        options = DemoOptions(options.key_bits, options.insecure_test_keys, options.lsh_bits, data)
        setup(work, options, job_text(options, names, standardise))
        procs: list = []
        start = time.perf_counter()
        try:
            run_processes(work, options, procs)
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
        seconds = time.perf_counter() - start
        right = total = 0
        for party, rows in zip(PARTIES, clients):
            with open(work / "out" / party / "predictions.csv") as fh:
                predicted = [r["label"] for r in csv.DictReader(fh)]
            unlabeled = y_partial[rows] < 0
            truth = [names[c] for c in y[rows]]
            right += sum(p == t for p, t, u in zip(predicted, truth, unlabeled) if u)
            total += int(unlabeled.sum())
        return {"accuracy": round(right / total, 4), "seconds": round(seconds, 1), "unlabeled": total,
                "rows": int(len(y))}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="1024-bit test keys")
    p.add_argument("--smoke", action="store_true",
                   help="the smallest run through every part, for CI: proves the benchmark runs; "
                   "its figures mean nothing")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    test_keys = args.quick or args.smoke
    options = DemoOptions(key_bits=512 if args.smoke else 1024 if args.quick else 2048, insecure_test_keys=test_keys,
                          lsh_bits=128 if args.smoke else 1024)
    results: dict[str, dict] = {}
    for name in ("wine",) if args.smoke else ("wine", "breast_cancer"):
        for standardise in (False, True):
            key = f"{name}_{'standardised' if standardise else 'raw'}"
            log(f"{key}: running coordinator and 3 institutions")
            results[key] = run_once(name, standardise, options, args.seed)
            log(f"{key}: {results[key]}")
    print(json.dumps({"benchmark": "standardise_xclp", "quick": args.quick, "smoke": args.smoke,
                      "key_bits": options.key_bits,
                      "lsh_bits": options.lsh_bits, "labeled_fraction": LABELED, "dirichlet": SKEW, "seed": args.seed,
                      **{f"{k}_accuracy": v["accuracy"] for k, v in results.items()},
                      **{f"{k}_seconds": v["seconds"] for k, v in results.items()}, "runs": results}))


if __name__ == "__main__":
    main()
