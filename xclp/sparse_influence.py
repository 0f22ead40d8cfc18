"""Sparse influence columns: S[:, l] = (I − α𝒲)^{-1} e_l by a push method, with its dropped mass measured.

docs/design.md §10.7. The column of labeled row l is, up to degree scaling, l's personalised PageRank
vector on the graph: with D the degrees of W (zero read as 1) and P = W D^{-1} the random walk's
column-stochastic matrix, 𝒲 = D^{-1/2} W D^{-1/2} = D^{-1/2} P D^{1/2}, so

    S[:, l] = D^{-1/2} q_l · √d_l   with   q_l = (I − αP)^{-1} e_l = e_l + αP q_l.

The push (Andersen et al. 2006 §3, in its non-lazy form; docs/references.md) keeps an estimate x
and a residual ρ with q_l = x + (I − αP)^{-1} ρ: starting from x = 0, ρ = e_l, a push at u moves ρ_u
into x_u and α·ρ_u·W_wu/d_u onto each neighbour w's residual. It pushes every u whose residual is at
least `tolerance`·d_u, and stops when none is left.

What that gives, exactly (no estimate):
- the column it returns is below the exact one entrywise (ρ ≥ 0 and (I − αP)^{-1} ≥ 0), never above
  but for the float32 rounding of its values (relative 2^-24: what the wire carries);
- P is column-stochastic, so 1ᵀ(I − αP)^{-1} = 1ᵀ/(1 − α): the exact q_l has mass 1/(1 − α), and the
  part left out has mass Σρ/(1 − α). `dropped` = Σρ is the share of the column's degree-weighted
  mass Σ_i √d_i S_il = √d_l/(1 − α) that is missing; every class column of a party's Z̄ = S_L Y_L
  then keeps at least 1 − max_l dropped_l of its degree-weighted mass (Y_L ≥ 0).
- each column costs at most about 1/(tolerance·(1 − α)) neighbour updates, whatever the graph's size.

A row isolated in the graph (no neighbour) has the column e_l, which the push gives exactly.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numba
import numpy as np
import scipy.sparse as sp

from xclp.errors import InvalidInput
from xclp.runtime import default_workers


@dataclass(frozen=True)
class SparseColumns:
    """Influence columns in compressed-column form: column j's rows are indices[indptr[j]:indptr[j+1]]
    (ascending) with values[...] (> 0, float32 values held as float64: what the wire carries), and
    dropped[j] its missing share of mass (module docstring)."""

    n: int
    indptr: np.ndarray  # int64[c + 1]
    indices: np.ndarray  # int64[nnz]
    values: np.ndarray  # float64[nnz]
    dropped: np.ndarray  # float64[c]

    @property
    def columns(self) -> int:
        return int(self.dropped.size)

    def dense(self) -> np.ndarray:
        """float64[n, c] (tests and small graphs)."""
        return self.matrix().toarray()

    def matrix(self) -> sp.csc_matrix:
        return sp.csc_matrix((self.values, self.indices, self.indptr), shape=(self.n, self.columns))


@numba.njit(cache=True, nogil=True)
def _push(indptr: np.ndarray, indices: np.ndarray, weights: np.ndarray, degrees: np.ndarray, alpha: float,
          tolerance: float, column: int, x: np.ndarray, rho: np.ndarray, queued: np.ndarray, queue: np.ndarray,
          touched: np.ndarray) -> tuple[int, float]:  # pragma: no cover - numba
    """One column's push; returns (touched count, Σρ left). x, rho, queued are all-zero on entry and
    left so for the touched rows after the caller reads them (it resets them)."""
    n = degrees.size
    rho[column] = 1.0
    touched[0] = column
    count = 1
    head, tail = 0, 1
    queue[0] = column
    queued[column] = 1
    while head != tail:
        u = queue[head]
        head += 1
        if head == n:
            head = 0
        queued[u] = 0
        mass = rho[u]
        if mass < tolerance * degrees[u]:
            continue
        x[u] += mass
        rho[u] = 0.0
        share = alpha * mass / degrees[u]
        for at in range(indptr[u], indptr[u + 1]):
            w = indices[at]
            if rho[w] == 0.0 and x[w] == 0.0:
                touched[count] = w
                count += 1
            rho[w] += share * weights[at]
            if queued[w] == 0 and rho[w] >= tolerance * degrees[w]:
                queued[w] = 1
                queue[tail] = w
                tail += 1
                if tail == n:
                    tail = 0
    left = 0.0
    for t in range(count):
        left += rho[touched[t]]
    return count, left


def degrees(W: sp.spmatrix) -> np.ndarray:
    """d_i = Σ_j W_ij, a degree of zero read as 1 (an isolated row stays isolated): what 𝒲 = D^{-½} W D^{-½}
    divides by (xclp.graph.normalise) and the push's random walk steps with."""
    out = np.asarray(W.sum(axis=1), dtype=np.float64).ravel()
    out[out == 0.0] = 1.0
    return out


def push_columns(W: sp.spmatrix, columns: np.ndarray, alpha: float, tolerance: float) -> SparseColumns:
    """S[:, columns] of (I − α𝒲)^{-1}, 𝒲 = normalise(W), each column pushed to `tolerance` (module
    docstring); W is the symmetric kNN adjacency (non-negative weights, zero diagonal)."""
    return Pusher(W, alpha, tolerance).solve(columns)


class Pusher:
    """The push on one graph (read once): `solve` pushes a block of columns (module docstring)."""

    def __init__(self, W: sp.spmatrix, alpha: float, tolerance: float) -> None:
        if not 0.0 < float(alpha) < 1.0:
            raise InvalidInput(f"alpha must be strictly between 0 and 1, got {alpha!r}")
        if not 0.0 < float(tolerance) < 1.0:
            raise InvalidInput(f"the push tolerance must be in (0, 1), got {tolerance!r}")
        W = sp.csr_matrix(W, dtype=np.float64, copy=True)
        W.eliminate_zeros()  # a stored zero is no edge (and would count a row twice)
        self.n = n = W.shape[0]
        if W.shape != (n, n) or n == 0:
            raise InvalidInput(f"W must be a non-empty square matrix, got shape {W.shape}")
        if W.nnz and W.data.min() < 0.0:
            raise InvalidInput("W must have non-negative weights")
        self.alpha, self.tolerance = float(alpha), float(tolerance)
        self.degrees = degrees(W)
        self.root = np.sqrt(self.degrees)
        self.graph = (W.indptr.astype(np.int64), W.indices.astype(np.int64), W.data)

    def solve(self, columns: np.ndarray) -> SparseColumns:
        """The columns `columns` (global row indices), in that order."""
        n, idx = self.n, np.asarray(columns, dtype=np.int64)
        if idx.ndim != 1 or (idx.size and (idx.min() < 0 or idx.max() >= n)):
            raise InvalidInput(f"columns must be row indices in 0..{n - 1}")
        root = self.root
        parts: list[tuple[np.ndarray, np.ndarray]] = [(np.empty(0, np.int64), np.empty(0))] * idx.size
        dropped = np.zeros(idx.size)

        def run(share: range) -> None:
            x, rho = np.zeros(n), np.zeros(n)
            queued = np.zeros(n, dtype=np.uint8)
            queue, touched = np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64)
            for j in share:
                source = int(idx[j])
                count, left = _push(*self.graph, self.degrees, self.alpha, self.tolerance, source,
                                    x, rho, queued, queue, touched)
                rows = np.sort(touched[:count])
                kept = rows[x[rows] > 0.0]
                # S[:, l] = D^{-1/2} q √d_l, in float32 as the wire carries it (xclp.v1.influence)
                parts[j] = (kept, (x[kept] * (root[source] / root[kept])).astype(np.float32).astype(np.float64))
                dropped[j] = left
                x[rows] = 0.0
                rho[rows] = 0.0

        workers = max(1, min(8, default_workers(), idx.size))
        cuts = np.linspace(0, idx.size, workers + 1).astype(int)
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="xclp-push") as pool:
            list(pool.map(run, [range(cuts[w], cuts[w + 1]) for w in range(workers)]))
        indptr = np.zeros(idx.size + 1, dtype=np.int64)
        np.cumsum([p[0].size for p in parts], out=indptr[1:])
        return SparseColumns(n=n, indptr=indptr,
                             indices=np.concatenate([p[0] for p in parts]) if parts else np.empty(0, np.int64),
                             values=np.concatenate([p[1] for p in parts]) if parts else np.empty(0),
                             dropped=dropped)
