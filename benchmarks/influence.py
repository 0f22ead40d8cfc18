"""The influence solve's solvers side by side on the same graph: what the coordinator computes after
SecureHamming, S_L = (I − α𝒲)^{-1}[:, labeled], in blocks of columns as it sends them on.

The graph is built as the coordinator's is, in plaintext: the rows of xclp_scale.py's table
(sklearn's digits, jittered repeats, standardised), LSH codes (L = 1024), max(cos(π·H/L), 0)^3 and
the k = 10 nearest rows of each, all pairs (the coordinator's candidate graph keeps fewer pairs; the
structure is the same kind). 10 % of the rows are labeled. Each solver solves the same blocks of
`solve_columns(n)` labeled columns:
- cg: conjugate gradients on the block's columns at once (the coordinator's solver before this
  benchmark), relative residual 1e-12;
- sparse: SuperLU's LU of I − α𝒲 once (minimum degree on the symmetric pattern), then two
  triangular solves per column; what `solver = "auto"` picks when the factors stay within
  SPARSE_FILL_MAX times the matrix's nonzeros.
A solver's seconds over all columns are projected from the blocks it ran (`--blocks`, every block
costs alike), plus its set-up (the factorisation). Both answers are checked against each other.

Reported (last stdout line, JSON): per size, n, nonzeros, labeled columns, per solver its set-up
and per-block seconds, projected total, iterations, fill and largest relative residual; `chosen`
(the solver "auto" picks at the largest size), `chosen_over_baseline` (its projected total over
cg's there) and `max_relative_residual` (over every solve).

With `--graph DIR` the graph is a coordinator's own instead: the W it dumped (a job's
`debug_dump = "DIR"`, test hook: W-data.npy, W-indices.npy, W-indptr.npy), e.g. the large run's.

Usage: python benchmarks/influence.py [--quick | --smoke] [--sizes 18000,54000] [--blocks 3] [--graph DIR]
       (--quick: 6 000 rows)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp
from _data import load_digits_data

from xclp.graph import InfluenceSolver, knn_from_similarity_rows, normalise, similarity
from xclp.hamming import hamming_matrix
from xclp.lsh import lsh_codes, lsh_projection
from xclp.v1.xclp import solve_columns

L, K, ALPHA, LABELED = 1024, 10, 0.99, 0.10


def say(message: str) -> None:
    print(f"influence: {message}", file=sys.stderr, flush=True)


def graph(n: int, seed: int = 0):
    """The kNN graph of n jittered, standardised digits rows from their LSH codes."""
    rng = np.random.default_rng(seed)
    X, _ = load_digits_data()
    X = X[rng.integers(0, X.shape[0], size=n)] + rng.normal(scale=0.5, size=(n, X.shape[1]))
    X = (X - X.mean(axis=0)) / X.std(axis=0)
    codes = lsh_codes(X, lsh_projection(seed, L, X.shape[1]))
    return knn_from_similarity_rows(lambda a, b: similarity(hamming_matrix(codes[a:b], codes), L, 3), n, K)


def dumped(directory: Path) -> sp.csr_matrix:
    """The W a coordinator dumped (debug_dump)."""
    data, indices, indptr = (np.load(directory / f"W-{part}.npy") for part in ("data", "indices", "indptr"))
    return sp.csr_matrix((data, indices, indptr), shape=(indptr.size - 1, indptr.size - 1))


def one_size(n: int, blocks: int, W: sp.csr_matrix | None = None) -> dict[str, Any]:
    started = time.perf_counter()
    Wn = normalise(graph(n) if W is None else W)
    say(f"n = {n}: graph {time.perf_counter() - started:.1f}s, {Wn.nnz} nonzeros")
    labeled = np.sort(np.random.default_rng(1).choice(n, size=round(LABELED * n), replace=False))
    width = solve_columns(n)
    chunks = [labeled[i: i + width] for i in range(0, labeled.size, width)]
    picked = np.linspace(0, len(chunks) - 1, min(blocks, len(chunks))).round().astype(int)
    out: dict[str, Any] = {"n": n, "nonzeros": int(Wn.nnz), "labeled_columns": int(labeled.size),
                           "block_columns": width, "blocks": len(chunks), "solvers": {}}
    answers = {}
    out["auto_picks"] = InfluenceSolver(Wn, ALPHA).stats.method
    # the solver "auto" picks is measured too (dense, at small sizes), so the ratio below has both sides
    projected: dict[str, float] = {}  # unrounded: a smoke run's blocks take milliseconds
    for method in dict.fromkeys(("sparse", "cg", out["auto_picks"])):
        t = time.perf_counter()
        solver = InfluenceSolver(Wn, ALPHA, method)  # type: ignore[arg-type]
        setup = time.perf_counter() - t
        per_block, got = [], []
        for i in picked:
            t = time.perf_counter()
            got.append(solver.solve(chunks[i]))
            per_block.append(time.perf_counter() - t)
        answers[method] = np.hstack(got)
        first = chunks[picked[0]]  # the same columns in two halves: the same bits (the contract of blocks)
        halves = np.hstack([solver.solve(first[: first.size // 2]), solver.solve(first[first.size // 2:])])
        split_equal = bool(np.array_equal(halves, got[0]))
        stats = solver.stats.as_dict()
        block = float(np.mean(per_block))
        projected[method] = setup + block * len(chunks)
        out["solvers"][method] = {"setup_seconds": round(setup, 3), "block_seconds": round(block, 3),
                                  "projected_seconds": round(projected[method], 1),
                                  "split_block_bit_identical": split_equal, **stats}
        say(f"n = {n}: {method}: set-up {setup:.2f}s, {block:.2f}s per block of {width}, projected "
            f"{projected[method]:.0f}s over {len(chunks)} blocks; {stats}")
    # what 'auto' picks over CG, the baseline, from the unrounded projections (rounded, CG's came to 0.0)
    out["chosen_over_baseline"] = round(projected[out["auto_picks"]] / max(projected["cg"], 1e-12), 4)
    out["max_abs_difference"] = max(float(np.abs(answers["sparse"] - a).max()) for a in answers.values())
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="6 000 rows")
    ap.add_argument("--smoke", action="store_true",
                    help="the smallest run through every part, for CI: proves the benchmark runs; "
                    "its figures mean nothing")
    ap.add_argument("--sizes", default="18000,54000", help="comma-separated row counts")
    ap.add_argument("--blocks", type=int, default=3, help="blocks each solver runs per size (the rest projected)")
    ap.add_argument("--graph", type=Path, help="a coordinator's dumped W (debug_dump) instead of the digits graph")
    args = ap.parse_args()
    if args.graph is not None:
        W = dumped(args.graph)
        results = [{**one_size(W.shape[0], args.blocks, W), "graph": str(args.graph)}]
    else:
        sizes = [900] if args.smoke else [6000] if args.quick else [int(s) for s in args.sizes.split(",")]
        results = [one_size(n, args.blocks) for n in sizes]
    chosen = results[-1]["auto_picks"]
    print(json.dumps({
        "cores": len(os.sched_getaffinity(0)), "load_average_1min": round(os.getloadavg()[0], 2),
        "lsh_bits": L, "k": K, "alpha": ALPHA, "labeled_fraction": LABELED, "sizes": results,
        "chosen": chosen,
        "chosen_over_baseline": results[-1]["chosen_over_baseline"],
        "max_relative_residual": max(s["max_relative_residual"] for r in results for s in r["solvers"].values()),
        "max_abs_difference": max(r["max_abs_difference"] for r in results),
    }))


if __name__ == "__main__":
    main()
