"""Sparse influence against the exact solve, side by side on the same graph (docs/design.md §10.7).

What the coordinator does after SecureHamming, in plaintext: the kNN graph of the rows' LSH codes
(L = 1024, k = 10, max(cos(π·H/L), 0)^3, all pairs), 10 % of the rows labeled, then the influence
columns of the labeled rows
- exact: (I − α𝒲)^{-1}[:, labeled] by the solver "auto" picks (the sparse LU at these sizes),
  dense float64 on the wire (what `influence_tolerance = 0` sends);
- pushed, per tolerance: xclp.sparse_influence, float32 values and uint32 rows on the wire.
Each gives Z = S_L Y_L (one-hot labels, label_norm = "none") and the labels argmax Z; reported per
tolerance: accuracy on the unlabeled rows, agreement with the exact labels, wire bytes, seconds, and
the share of a column's degree-weighted mass left out (largest and mean: every class of Z keeps at
least 1 − the largest).

Data: `digits` (sklearn's, jittered repeats, always available) and `fashion-mnist` (Debian's
dataset-fashion-mnist; 784 pixels, 10 classes), standardised.

Reported (last stdout line, JSON): per data set n, labeled columns, exact accuracy, bytes and
seconds, and the runs; `bytes_ratio` and `seconds_ratio` (pushed at the default tolerance over
exact, at the last data set) and `accuracy_change` there (points; positive: the push is more accurate).

Usage: python benchmarks/sparse_influence.py [--smoke] [--rows 18000] [--data digits,fashion-mnist]
       [--tolerances 3e-4,1e-4,3e-5]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

import numpy as np
from _data import load_digits_data, load_fashion_mnist

from xclp.graph import InfluenceSolver, knn_from_similarity_rows, normalise, similarity
from xclp.hamming import hamming_matrix
from xclp.lsh import lsh_codes, lsh_projection
from xclp.propagation import label_matrix, predict
from xclp.sparse_influence import Pusher
from xclp.v1.xclp import AUTO_INFLUENCE_TOLERANCE, solve_columns

L, K, ALPHA, LABELED = 1024, 10, 0.99, 0.10


def say(message: str) -> None:
    print(f"sparse_influence: {message}", file=sys.stderr, flush=True)


def table(name: str, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    if name == "fashion-mnist":
        X, y = load_fashion_mnist(n, rng)
    elif name == "digits":
        X0, y0 = load_digits_data()
        pick = rng.integers(0, X0.shape[0], size=n)
        X, y = X0[pick] + rng.normal(scale=0.5, size=(n, X0.shape[1])), y0[pick]
    else:
        raise SystemExit(f"unknown data set {name!r}: digits or fashion-mnist")
    spread = X.std(axis=0)
    return (X - X.mean(axis=0)) / np.where(spread > 0, spread, 1.0), y


def one_data_set(name: str, n: int, tolerances: list[float]) -> dict[str, Any]:
    rng = np.random.default_rng(0)
    X, y = table(name, n, rng)
    started = time.perf_counter()
    codes = lsh_codes(X, lsh_projection(0, L, X.shape[1]))
    W = knn_from_similarity_rows(lambda a, b: similarity(hamming_matrix(codes[a:b], codes), L, 3), n, K)
    say(f"{name}: graph of {n} rows in {time.perf_counter() - started:.0f} s")
    labeled = np.sort(rng.choice(n, size=round(LABELED * n), replace=False))
    unlabeled = np.setdiff1d(np.arange(n), labeled)
    C = int(y.max()) + 1
    Y = label_matrix(y[labeled], C)

    def accuracy(Z: np.ndarray) -> float:
        return round(float(np.mean(predict(Z)[0][unlabeled] == y[unlabeled])), 4)

    started = time.perf_counter()
    solver, Z = InfluenceSolver(normalise(W), ALPHA), np.zeros((n, C))
    width = solve_columns(n)
    for at in range(0, labeled.size, width):  # in blocks, as the coordinator solves and sends them
        Z += solver.solve(labeled[at : at + width]) @ Y[at : at + width]
    exact = {"method": solver.stats.method, "accuracy": accuracy(Z), "bytes": 8 * n * labeled.size,
             "seconds": round(time.perf_counter() - started, 2)}
    say(f"{name}: exact {json.dumps(exact)}")
    exact_labels = predict(Z)[0][unlabeled]
    runs = []
    for tolerance in tolerances:
        started = time.perf_counter()
        pusher, Zs, nnz, dropped = Pusher(W, ALPHA, tolerance), np.zeros((n, C)), 0, []
        for at in range(0, labeled.size, width):
            cols = pusher.solve(labeled[at : at + width])
            Zs += cols.matrix() @ Y[at : at + width]
            nnz += cols.indices.size
            dropped.append(cols.dropped)
        seconds = time.perf_counter() - started
        left = np.concatenate(dropped)
        run = {"tolerance": tolerance, "accuracy": accuracy(Zs),
               "agreement_with_exact": round(float(np.mean(predict(Zs)[0][unlabeled] == exact_labels)), 4),
               "entries_per_column": round(nnz / labeled.size, 1), "bytes": 8 * nnz + 8 * labeled.size,
               "seconds": round(seconds, 2), "dropped_max": round(float(left.max()), 4),
               "dropped_mean": round(float(left.mean()), 4)}
        say(f"{name}: {json.dumps(run)}")
        runs.append(run)
    return {"data": name, "rows": n, "labeled_columns": int(labeled.size), "exact": exact, "pushed": runs}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true",
                    help="the smallest run through every part, for CI: proves the benchmark runs; "
                    "its figures mean nothing")
    ap.add_argument("--rows", type=int, default=18_000, help="rows of each data set")
    ap.add_argument("--data", default="digits,fashion-mnist", help="comma-separated: digits, fashion-mnist")
    ap.add_argument("--tolerances", default=f"1e-3,3e-4,{AUTO_INFLUENCE_TOLERANCE:g},3e-5",
                    help="comma-separated push tolerances")
    args = ap.parse_args()
    rows, names = (600, ["digits"]) if args.smoke else (args.rows, args.data.split(","))
    tolerances = [float(t) for t in args.tolerances.split(",")]
    if AUTO_INFLUENCE_TOLERANCE not in tolerances:
        tolerances.append(AUTO_INFLUENCE_TOLERANCE)
    results = [one_data_set(name, rows, tolerances) for name in names]
    last = results[-1]
    default = next(r for r in last["pushed"] if r["tolerance"] == AUTO_INFLUENCE_TOLERANCE)
    print(json.dumps({
        "cores": len(os.sched_getaffinity(0)), "load_average_1min": round(os.getloadavg()[0], 2),
        "lsh_bits": L, "k": K, "alpha": ALPHA, "labeled_fraction": LABELED, "default_tolerance":
        AUTO_INFLUENCE_TOLERANCE, "data_sets": results,
        "bytes_ratio": round(default["bytes"] / last["exact"]["bytes"], 4),
        "seconds_ratio": round(default["seconds"] / max(last["exact"]["seconds"], 1e-9), 4),
        "accuracy_change": round(100 * (default["accuracy"] - last["exact"]["accuracy"]), 2),
    }))


if __name__ == "__main__":
    main()
