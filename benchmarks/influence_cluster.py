"""The coordinator's influence solve on its own cores against the same solve on a Dask cluster
(`xclp-server serve --workers`, server/offload.py, docs/design.md §10.8), side by side on one graph.

The graph is benchmarks/influence.py's (jittered digits rows, L = 1024 LSH codes, k = 10, all pairs),
10 % of its rows labeled, solved in the blocks of `solve_columns(n)` columns the coordinator sends:
- "exact": what an unset `solver` gives above DENSE_MAX_NODES rows, the sparse LU (or CG past its fill);
- "push": the sparse influence at `influence_tolerance` (default 1e-4, the default above 20 000 rows).
Each is timed whole (set-up included) on the coordinator (`InfluenceProblem.solver`, its threads on
every core) and through `ClusterSolver` on a scheduler and `--workers` single-threaded workers started
here over mutual TLS on the same machine, alternating, `--rounds` times. Every block's bytes are
compared: the cluster's columns are the coordinator's, bit for bit.

Reported (last stdout line, JSON): per mode the seconds of each side and round, their ratio
(cluster over coordinator, means), the bytes sent to the cluster (the graph, once) and back (the
blocks), and whether every block was identical.

Usage: python benchmarks/influence_cluster.py [--smoke] [--rows 54000] [--workers 2] [--modes exact,push]
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import pickle
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from influence import ALPHA, LABELED, graph

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the test cluster lives in tests/, not in the package

from xclp.server.offload import ClusterSolver, InfluenceProblem
from xclp.sparse_influence import SparseColumns
from xclp.v1.xclp import solve_columns
from xclp.workers import DaskWorkers


def say(message: str) -> None:
    print(f"influence_cluster: {message}", file=sys.stderr, flush=True)


def digest(block: np.ndarray | SparseColumns) -> str:
    parts = [block] if isinstance(block, np.ndarray) else [block.indptr, block.indices, block.values, block.dropped]
    return hashlib.sha256(b"".join(np.ascontiguousarray(p).tobytes() for p in parts)).hexdigest()


def nbytes(block: np.ndarray | SparseColumns) -> int:
    if isinstance(block, np.ndarray):
        return int(block.nbytes)
    return int(sum(a.nbytes for a in (block.indptr, block.indices, block.values, block.dropped)))


def solve_all(solve: Any, planned: list[np.ndarray]) -> tuple[float, list[str], int]:
    """Seconds for every block, their digests and bytes."""
    started, digests, size = time.perf_counter(), [], 0
    for columns in planned:
        block = solve(columns)
        digests.append(digest(block))
        size += nbytes(block)
    return time.perf_counter() - started, digests, size


def one_mode(workers: DaskWorkers, problem: InfluenceProblem, planned: list[np.ndarray], rounds: int,
             name: str) -> dict[str, Any]:
    times: dict[str, list[float]] = {"coordinator": [], "cluster": []}
    identical, received = True, 0
    for round_ in range(rounds):
        here = time.perf_counter()
        _, mine, _ = solve_all(problem.solver().solve, planned)  # timed with the solver's set-up
        times["coordinator"].append(time.perf_counter() - here)
        solver = ClusterSolver(workers, problem, planned)
        try:
            seconds, theirs, received = solve_all(solver.solve, planned)
        finally:
            solver.close()
        times["cluster"].append(seconds)
        identical &= mine == theirs
        say(f"{name} round {round_}: coordinator {times['coordinator'][-1]:.1f}s, cluster {seconds:.1f}s "
            f"({solver.stats.method}), blocks identical: {mine == theirs}")
    means = {side: sum(v) / len(v) for side, v in times.items()}
    return {"method": solver.stats.method, "coordinator_seconds": [round(x, 2) for x in times["coordinator"]],
            "cluster_seconds": [round(x, 2) for x in times["cluster"]],
            "cluster_over_coordinator": round(means["cluster"] / max(means["coordinator"], 1e-9), 3),
            "bytes_to_cluster": len(pickle.dumps(problem)), "bytes_from_cluster": received,
            "blocks_identical": identical}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="2 000 rows, one round")
    ap.add_argument("--rows", type=int, default=54000)
    ap.add_argument("--workers", type=int, default=2, help="single-threaded Dask workers started here")
    ap.add_argument("--modes", default="exact,push")
    ap.add_argument("--tolerance", type=float, default=1e-4, help="the push's tolerance")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    if args.smoke:
        args.rows, args.rounds = 2000, 1
    from tests.dask_cluster import cluster

    started = time.perf_counter()
    W = graph(args.rows)
    labeled = np.sort(np.random.default_rng(1).choice(args.rows, size=round(LABELED * args.rows), replace=False))
    width = solve_columns(args.rows)
    planned = [labeled[at : at + width] for at in range(0, labeled.size, width)]
    say(f"{args.rows} rows: graph {time.perf_counter() - started:.1f}s, {W.nnz} edges, {labeled.size} labeled "
        f"columns in {len(planned)} blocks")
    out: dict[str, Any] = {"rows": args.rows, "labeled_columns": int(labeled.size), "blocks": len(planned),
                           "workers": args.workers, "modes": {}}
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="xclp-dask-")))
        address = stack.enter_context(cluster(tmp, args.workers)).address
        workers = stack.enter_context(DaskWorkers.connect(address, work="the influence solve"))
        say(workers.describe())
        for mode in args.modes.split(","):
            problem = InfluenceProblem(W, ALPHA, tolerance=args.tolerance if mode == "push" else 0.0)
            out["modes"][mode] = one_mode(workers, problem, planned, args.rounds, mode)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
