"""RACE angular-kernel KDE accuracy and sketch speed on a synthetic Gaussian mixture.

    python benchmarks/race_kde.py [--quick | --smoke]

Data: 20 000 rows (10 000 with --quick) in R^16 from a 10-component Gaussian mixture (centres
N(0, 3²·I), unit spread) — no download is possible and sklearn's bundled sets are all < 2 000 rows.
Held-out queries come from the same mixture. Kernel: SRP with p = 4 bits per row, i.e. the angular
kernel (1 − θ/π)^4, W = 2^4 buckets. For R in {100, 1000}: mean relative error |est − exact|/exact
of the mean estimator against the exact KDE (1/N)·Σ_x k(x, q); the same after the ε = 1 private
release (Laplace R/ε on raw counts, seeded here for reproducibility); and points_per_second for
building the sketch (hashing + counting), with xclp.race's numba kernels and, side by side in the
same run, with the plain numpy hashing they replaced (tests/oracles/race_numpy.py: one BLAS product,
an [n, R] bucket array, np.bincount); best of 3 each. Progress goes to stderr; the last stdout line
is JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the baseline lives in tests/oracles, not in the package
from tests.oracles.race_numpy import counts_numpy
from xclp.race import RaceHashes, RaceParams, exact_kde, private_release, query, sketch


def mixture(n: int, dim: int, rng: np.random.Generator, centres: np.ndarray) -> np.ndarray:
    return centres[rng.integers(0, centres.shape[0], n)] + rng.standard_normal((n, dim))


def best_of(times: int, work: object) -> float:
    """The fastest of `times` runs of `work()`, in seconds."""
    best = float("inf")
    for _ in range(times):
        t0 = time.perf_counter()
        work()  # type: ignore[operator]
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="10 000 rows and 200 queries")
    parser.add_argument("--smoke", action="store_true",
                        help="the smallest run through every part, for CI: proves the benchmark runs; "
                        "its figures mean nothing")
    args = parser.parse_args()
    n, n_queries, dim, p = ((500, 20, 16, 4) if args.smoke else (10_000, 200, 16, 4) if args.quick
                            else (20_000, 1000, 16, 4))

    rng = np.random.default_rng(0)
    centres = 3.0 * rng.standard_normal((10, dim))
    X, Q = mixture(n, dim, rng, centres), mixture(n_queries, dim, rng, centres)

    results: dict[str, dict[str, float]] = {}
    for R in (100, 1000):
        params = RaceParams(rows=R, width=2**p, family="srp", p=p)
        hashes = RaceHashes.from_seed(1, params, dim)
        sketch(hashes, X[:10])  # compile (or load) the kernels and warm caches before timing
        seconds = best_of(3, lambda h=hashes: sketch(h, X))
        baseline = best_of(3, lambda h=hashes: counts_numpy(h, X))
        S = sketch(hashes, X)
        exact = exact_kde(params, X, Q)
        rel = np.abs(query(S, n, hashes, Q) - exact) / exact
        noisy = private_release(S, 1.0, source=np.random.default_rng(R))
        rel_private = np.abs(query(noisy, n, hashes, Q) - exact) / exact
        results[str(R)] = {
            "mean_relative_error": round(float(rel.mean()), 5),
            "private_eps1_mean_relative_error": round(float(rel_private.mean()), 5),
            "points_per_second": round(n / seconds, 1),
            "points_per_second_numpy_baseline": round(n / baseline, 1),
        }
        print(f"R={R}: {results[str(R)]} (exact KDE mean {exact.mean():.4f})", file=sys.stderr)

    print(
        json.dumps(
            {
                "benchmark": "race_kde",
                "dataset": f"synthetic 10-component Gaussian mixture, {n} x {dim}, {n_queries} held-out queries",
                "kernel": f"angular (1 - theta/pi)^{p} (SRP, W = {2**p})",
                "mean_relative_error": {R: r["mean_relative_error"] for R, r in results.items()},
                "private_eps1_mean_relative_error": {R: r["private_eps1_mean_relative_error"]
                                                     for R, r in results.items()},
                "points_per_second": {R: r["points_per_second"] for R, r in results.items()},
                "points_per_second_numpy_baseline": {R: r["points_per_second_numpy_baseline"]
                                                     for R, r in results.items()},
            }
        )
    )


if __name__ == "__main__":
    main()
