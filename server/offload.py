"""The coordinator's influence solve on the operator's own Dask cluster (docs/design.md §10.8).

`xclp-server serve --workers tls://scheduler:8786`: the blocks of influence columns that the XCLP
graph step solves (server/jobs/xclp.py `Distribute`) are solved on the cluster's workers instead of
the coordinator's cores, a few blocks ahead of the one being sent. Each worker process builds the
solver once per run (the sparse LU's factorisation, the push's graph arrays) from the graph sent
to the cluster once, and solves the blocks it is given with the same code and the same block cuts
as the coordinator: the columns are the ones the coordinator would have solved, bit for bit (the
dense Cholesky of a small graph goes through BLAS, whose last bits may differ on another CPU).

What the cluster gets is what the coordinator holds: the kNN graph W and the labeled rows' global
indices (docs/design.md §2: the coordinator learns both). So the cluster must be the operator's own
machines: mutual TLS the Dask way, tcp:// only with `--insecure-workers`, exactly as a party's
`--workers` (xclp/workers.py, which this reuses).

A cluster that goes away (the scheduler lost, every worker gone for WORKERLESS_SECONDS) costs no
run: the coordinator solves the rest of the blocks itself and says so in its log. A block that
fails for a reason of its own (a forced "sparse" whose factors would be too dense) fails the
step as it would on the coordinator.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp

from xclp.graph import InfluenceMethod, InfluenceSolver, PushSolver, SolveStats, normalise
from xclp.sparse_influence import SparseColumns
from xclp.workers import DaskWorkers, WorkersLost

log = logging.getLogger("xclp.server")

Block = np.ndarray | SparseColumns
Solver = InfluenceSolver | PushSolver
AHEAD_MAX = 4  # blocks solved ahead of the one being sent: each at most SOLVE_BYTES / 8 on the coordinator
WORKERLESS_SECONDS = 60.0  # a cluster with no worker for this long is lost: the coordinator goes on alone
POLL_SECONDS = 1.0  # how often a wait for a block looks at whether the run is still live
KEEP_SOLVERS = 4  # solvers a worker process keeps (runs solving at once); a run's is dropped when it ends


@dataclass(frozen=True)
class InfluenceProblem:
    """What a solver of the influence columns is built from (docs/design.md §5.5, §10.7): the kNN
    adjacency W, α, and either the push's tolerance or the exact solve's method."""

    W: sp.csr_matrix
    alpha: float
    method: InfluenceMethod = "auto"
    tolerance: float = 0.0

    def solver(self) -> Solver:
        """The push with a tolerance, else the exact solve of (I − α𝒲)."""
        if self.tolerance:
            return PushSolver(self.W, self.alpha, self.tolerance)
        return InfluenceSolver(normalise(self.W), self.alpha, self.method)


# --- on a worker -----------------------------------------------------------------------------------

_built: collections.OrderedDict[str, tuple[threading.Lock, list[Solver]]] = collections.OrderedDict()
_built_lock = threading.Lock()


def solve_block(key: str, problem: InfluenceProblem, columns: np.ndarray) -> tuple[Block, SolveStats]:
    """On a worker: the block `columns` of run `key`'s influence, and what solving it took (its
    `SolveStats` for this block alone). The solver is built at the process's first block of the
    run and kept; its blocks are solved one at a time (each uses the worker machine's cores)."""
    with _built_lock:
        entry = _built.setdefault(key, (threading.Lock(), []))
        _built.move_to_end(key)
        while len(_built) > KEEP_SOLVERS:
            _built.popitem(last=False)
    lock, kept = entry
    with lock:
        if not kept:
            kept.append(problem.solver())
        return _counted(kept[0], columns)


def forget(key: str) -> None:
    """On every worker (`Client.run`), when the run's solve is over: drop its solver (an LU's factors)."""
    with _built_lock:
        _built.pop(key, None)


def _counted(solver: Solver, columns: np.ndarray) -> tuple[Block, SolveStats]:
    """The block `columns`, and its share of the solver's running stats (the maxima are the solver's so
    far: `merge` takes them by max)."""
    before = dataclasses.replace(solver.stats)
    block, after = solver.solve(columns), solver.stats
    return block, dataclasses.replace(
        after, columns=after.columns - before.columns, blocks=after.blocks - before.blocks,
        seconds=after.seconds - before.seconds, nonzeros=after.nonzeros - before.nonzeros,
        dropped_sum=after.dropped_sum - before.dropped_sum)


def merge(total: SolveStats, part: SolveStats) -> None:
    """Add a block's (or a solver's) stats to `total`; `seconds` is the caller's (wall time)."""
    total.method = part.method
    total.columns += part.columns
    total.blocks += part.blocks
    total.nonzeros += part.nonzeros
    total.dropped_sum += part.dropped_sum
    for name in ("iterations", "max_residual", "fill", "factor_seconds", "dropped_max", "tolerance"):
        setattr(total, name, max(getattr(total, name), getattr(part, name)))


# --- on the coordinator ----------------------------------------------------------------------------

class ClusterSolver:
    """The blocks `planned` (global column indices, in the order the coordinator sends them) solved on
    the cluster, up to `ahead` at a time; `solve` takes them in that order, skipping any it is not
    asked for (a receiver gone), and returns None once `live()` is false. `stats` is the whole
    solve's, its seconds the wall time the coordinator waited and solved."""

    def __init__(self, workers: DaskWorkers, problem: InfluenceProblem, planned: Sequence[np.ndarray], *,
                 live: Callable[[], bool] = lambda: True, ahead: int | None = None) -> None:
        self.workers, self.problem, self.live = workers, problem, live
        self.key = secrets.token_hex(8)
        self.stats = SolveStats("push" if problem.tolerance else problem.method, tolerance=problem.tolerance)
        self._todo = collections.deque(np.asarray(c, dtype=np.int64) for c in planned)
        self._pending: collections.deque[tuple[np.ndarray, Future[tuple[Block, SolveStats]]]] = collections.deque()
        self._local: Solver | None = None
        self._shared: Any = None
        self._workerless_since: float | None = None
        try:
            self.ahead = max(1, min(AHEAD_MAX, ahead if ahead is not None else workers.threads()))
        except WorkersLost as exc:  # gone since the coordinator started: it solves every block itself
            self.ahead = 1
            self._lost(str(exc))

    def describe(self) -> str:
        """Where the blocks were solved, for the coordinator's log."""
        where = f"on the Dask scheduler {self.workers.address} ({self.ahead} blocks at a time)"
        return where if self._local is None else f"{where}, then on the coordinator (the cluster was lost)"

    def solve(self, columns: np.ndarray) -> Block | None:
        """The block `columns`, which must be one of the planned blocks not yet taken."""
        began, columns = time.perf_counter(), np.asarray(columns, dtype=np.int64)
        try:
            if self._local is None:
                block = self._from_cluster(columns)
                if block is not None or not self.live():
                    return block
            return self._solve_here(columns)
        finally:
            self.stats.seconds += time.perf_counter() - began

    def close(self) -> None:
        """The solve is over: the workers drop this run's solver, the cluster its copy of the graph."""
        self._pending.clear()
        self._shared = None
        if self._local is None:
            try:
                self.workers.client.run(forget, self.key)
            except Exception as exc:  # a cluster gone has nothing left to drop
                log.debug("the Dask workers did not drop an influence solver: %s", exc)

    def _from_cluster(self, columns: np.ndarray) -> Block | None:
        """None when the run is no longer live, or the cluster was lost (then `_local` is set)."""
        while self._pending and not np.array_equal(self._pending[0][0], columns):
            self._pending.popleft()  # planned for a receiver that is gone: solved, not sent
        if not self._pending:
            while self._todo and not np.array_equal(self._todo[0], columns):
                self._todo.popleft()
        try:
            self._submit()
            if not self._pending:
                raise ValueError("the influence columns asked for were not planned")
            future = self._pending[0][1]
            while self.live():
                try:
                    block, part = future.result(timeout=POLL_SECONDS)
                except FutureTimeout:
                    self._check_workers()
                    continue
                self._pending.popleft()
                merge(self.stats, part)
                self._submit()
                return block
            return None
        except WorkersLost as exc:
            self._lost(str(exc))
            return None

    def _submit(self) -> None:
        if self._shared is None:
            try:
                self._shared = self.workers.share(self.problem)
            except Exception as exc:
                raise WorkersLost(f"the Dask scheduler {self.workers.address} is gone: {exc}") from None
        while self._todo and len(self._pending) < self.ahead:
            columns = self._todo.popleft()
            self._pending.append((columns, self.workers.submit(solve_block, self.key, self._shared, columns)))

    def _check_workers(self) -> None:
        """WorkersLost once the cluster has had no worker for WORKERLESS_SECONDS (Dask would hold
        the blocks until one comes)."""
        now = time.monotonic()
        if self.workers.connected_threads() > 0:
            self._workerless_since = None
        elif self._workerless_since is None:
            self._workerless_since = now
        elif now - self._workerless_since >= WORKERLESS_SECONDS:
            raise WorkersLost(f"the Dask scheduler {self.workers.address} has had no worker for "
                              f"{WORKERLESS_SECONDS:.0f} s")

    def _lost(self, reason: str) -> None:
        log.warning("the influence solve's Dask cluster is lost (%s): the coordinator solves the rest itself",
                    reason)
        self._pending.clear()
        self._todo.clear()
        self._shared = None
        self._local = self.problem.solver()

    def _solve_here(self, columns: np.ndarray) -> Block:
        assert self._local is not None
        block, part = _counted(self._local, columns)
        merge(self.stats, part)
        return block
