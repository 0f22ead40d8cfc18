"""The coordinator's graph step: H -> kNN graph -> normalised adjacency -> influence columns.

Paper 003 Alg. 1 lines 4-8 with docs/design.md §5.4's choices: similarity max(cos(π·H/L), 0)^p (p = 3 as in
the authors' code), keep the k largest entries per row with ties broken by the smaller column
index, W = B + Bᵀ with zero diagonal, 𝒲 = D^{-½} W D^{-½} (zero degrees read as 1), and
S_L = (I − α𝒲)^{-1}[:, labeled], never forming a dense inverse.

The solve (`InfluenceSolver`): dense Cholesky up to DENSE_MAX_NODES rows; above, a sparse LU of
I − α𝒲 (SuperLU, minimum-degree ordering of its symmetric pattern) when its factors stay within
SPARSE_FILL_MAX times the matrix's nonzeros — on the kNN graphs of real data they are 10 to 30
times it, and then each column costs two triangular solves instead of a hundred-odd CG steps — else
conjugate gradients (benchmarks/influence.py compares them on the same graph).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Literal

import numpy as np
import scipy.linalg
import scipy.sparse as sp
import scipy.sparse.linalg as spl

from xclp.errors import InvalidInput
from xclp.lsh import check_lsh_bits, estimate_cosine
from xclp.runtime import default_workers
from xclp.sparse_influence import Pusher, SparseColumns, degrees

# Above this many nodes `influence_columns(method="auto")` switches from dense Cholesky to a sparse one.
DENSE_MAX_NODES = 3000
# The sparse LU's nonzeros over I − α𝒲's at most, for "auto": about where CG, a hundred-odd products
# with the matrix per column, becomes the cheaper (the large run's candidate graph, 54 000 rows: fill
# 31.7, the LU 4× faster than CG; at 24 it fell back to CG), and what the coordinator's memory
# estimate allows for the factors (server/steps/xclp.py coordinator_bytes). A graph whose factors
# pass it costs the attempt (points spread evenly in 10 dimensions, 18 000 rows: about as long as
# the CG that follows).
SPARSE_FILL_MAX = 64
SPARSE_FILL_FORCED = 1000  # the bound for solver = "sparse" (SuperLU sizes its work space by it)
# A factor is taken as exact when it solves a fixed right-hand side to this relative residual (a
# factor whose fill hit SPARSE_FILL_MAX dropped entries and misses it by far).
_EXACT_RESIDUAL = 1e-10

# Rows of the similarity matrix materialised at once while selecting neighbours (float64[block, n]).
_SIM_BLOCK_ELEMENTS = 1 << 22

InfluenceMethod = Literal["auto", "dense", "sparse", "cg"]


@dataclass(frozen=True)
class GraphParams:
    """Graph and propagation parameters (docs/design.md §5 defaults).

    k: neighbours kept per row; alpha: propagation weight in (0, 1); power: exponent p applied to
    the clipped cosine (p = 1 is the paper's text, p = 3 the authors' code).
    """

    k: int = 10
    alpha: float = 0.99
    power: float = 3

    def __post_init__(self) -> None:
        if isinstance(self.k, bool) or not isinstance(self.k, (int, np.integer)) or self.k < 1:
            raise InvalidInput(f"k (neighbours per row) must be an integer >= 1, got {self.k!r}")
        if not isinstance(self.alpha, (int, float, np.floating)) or not 0.0 < float(self.alpha) < 1.0:
            raise InvalidInput(f"alpha must be a number strictly between 0 and 1, got {self.alpha!r}")
        if (
            isinstance(self.power, bool)
            or not isinstance(self.power, (int, float, np.integer, np.floating))
            or not np.isfinite(self.power)
            or self.power <= 0
        ):
            raise InvalidInput(f"power (similarity exponent p) must be a positive number, got {self.power!r}")


def similarity(H: np.ndarray, lsh_bits: int, power: float) -> np.ndarray:
    """Edge weights from Hamming distances: max(cos(π·H/L), 0)^p as float64 of H's shape."""
    return clipped_power(estimate_cosine(H, lsh_bits), power)


def clipped_power(cosine: np.ndarray, power: float) -> np.ndarray:
    """max(cosine, 0)^p: negative similarities carry no edge weight (docs/design.md §5.4)."""
    return np.maximum(np.asarray(cosine, dtype=np.float64), 0.0) ** power


def _check_square(H: object, name: str = "H") -> np.ndarray:
    arr = np.asarray(H)
    if arr.ndim != 2 or arr.shape[0] != arr.shape[1]:
        raise InvalidInput(f"{name} must be a square n x n matrix, got shape {arr.shape}")
    return arr


def check_k(k: int, n: int) -> None:
    """Refuse k neighbours per row of an n-row graph unless k < n."""
    if k >= n:
        raise InvalidInput(
            f"k = {k} neighbours needs more than k rows, but the graph has only n = {n}; "
            f"choose k <= {n - 1} or add data"
        )


def _top_k_mask(sim: np.ndarray, k: int) -> np.ndarray:
    """bool[b, n]: the k largest entries of each row, ties resolved towards smaller column index."""
    n = sim.shape[1]
    kth = np.partition(sim, n - k, axis=1)[:, n - k : n - k + 1]  # k-th largest value per row
    above = sim > kth
    at = sim == kth
    # Among entries equal to the k-th largest, the first (k − #above) by column index get in.
    need = k - above.sum(axis=1, keepdims=True)
    return above | (at & (np.cumsum(at, axis=1) <= need))


def knn_from_similarity_rows(rows: Callable[[int, int], np.ndarray], n: int, k: int) -> sp.csr_matrix:
    """B + Bᵀ from a row-block generator of the n×n similarity: `rows(start, stop) -> float64[stop-start, n]`.

    Self loops are excluded before selecting, zero-weight picks are dropped, the diagonal is zero.
    """
    check_k(k, n)
    block = max(1, _SIM_BLOCK_ELEMENTS // max(n, 1))
    indptr_parts, cols_parts, vals_parts = [], [], []
    for start in range(0, n, block):
        stop = min(n, start + block)
        sim = np.array(rows(start, stop), dtype=np.float64)
        if sim.shape != (stop - start, n):
            raise InvalidInput(f"similarity block has shape {sim.shape}, expected {(stop - start, n)}")
        local = np.arange(stop - start)
        sim[local, start + local] = -np.inf  # self excluded (Alg. 1 line 5 keeps k *other* points)
        keep = _top_k_mask(sim, k) & (sim > 0.0)
        r, c = np.nonzero(keep)
        indptr_parts.append(np.bincount(r, minlength=stop - start))
        cols_parts.append(c)
        vals_parts.append(sim[r, c])
    indptr = np.concatenate([[0], np.cumsum(np.concatenate(indptr_parts))])
    B = sp.csr_matrix((np.concatenate(vals_parts), np.concatenate(cols_parts), indptr), shape=(n, n))
    W = (B + B.T).tocsr()  # Alg. 1 line 6: symmetrise
    W.setdiag(0.0)
    W.eliminate_zeros()
    W.sort_indices()
    return W


def knn_adjacency(H: np.ndarray, lsh_bits: int, params: GraphParams,
                  candidates: np.ndarray | None = None) -> sp.csr_matrix:
    """Symmetric kNN adjacency W (float64 csr[n, n]) from the pooled Hamming matrix H (int[n, n]);
    with `candidates` (bool[n, n], xclp.candidates.candidate_mask) only those pairs may be neighbours."""
    lsh_bits = check_lsh_bits(lsh_bits)
    H = _check_square(H)
    if H.dtype.kind not in "iu":
        raise InvalidInput(f"H must hold integer Hamming distances, got dtype {H.dtype}")
    if H.size and (H.min() < 0 or H.max() > lsh_bits):
        raise InvalidInput(f"Hamming distances must lie in [0, L = {lsh_bits}], got range [{H.min()}, {H.max()}]")
    if candidates is not None and np.shape(candidates) != H.shape:
        raise InvalidInput(f"candidates must be bool{list(H.shape)}, got shape {np.shape(candidates)}")

    def rows(a: int, b: int) -> np.ndarray:
        sim = similarity(H[a:b], lsh_bits, params.power)
        return sim if candidates is None else np.where(candidates[a:b], sim, -np.inf)

    return knn_from_similarity_rows(rows, H.shape[0], params.k)


def normalise(W: sp.spmatrix) -> sp.csr_matrix:
    """𝒲 = D^{-½} W D^{-½} with d_i = Σ_j W_ij, zero degrees read as 1 (isolated nodes stay isolated)."""
    W = sp.csr_matrix(W, dtype=np.float64)
    if W.shape[0] != W.shape[1]:
        raise InvalidInput(f"W must be square, got shape {W.shape}")
    scale = sp.diags(1.0 / np.sqrt(degrees(W)))
    return (scale @ W @ scale).tocsr()


def _check_labeled(labeled: object, n: int) -> np.ndarray:
    idx = np.asarray(labeled)
    if idx.ndim != 1 or idx.dtype.kind not in "iu":
        raise InvalidInput(f"labeled must be a 1-D integer index array, got dtype {idx.dtype} shape {idx.shape}")
    idx = idx.astype(np.int64)
    if idx.size == 0:
        raise InvalidInput("no labeled rows: label propagation needs at least one labeled row")
    if idx.min() < 0 or idx.max() >= n:
        raise InvalidInput(f"labeled indices must lie in 0..{n - 1}, got range [{idx.min()}, {idx.max()}]")
    if np.unique(idx).size != idx.size:
        raise InvalidInput("labeled indices must not repeat")
    return idx


def influence_columns(
    Wn: sp.spmatrix,
    labeled: np.ndarray,
    alpha: float,
    method: InfluenceMethod = "auto",
    *,
    dense_max_nodes: int = DENSE_MAX_NODES,
    rtol: float = 1e-12,
) -> np.ndarray:
    """S_L = (I − α𝒲)^{-1}[:, labeled] as float64[n, l] (Alg. 1 line 8, only the columns parties need).

    I − α𝒲 is symmetric positive definite (eigenvalues in [1−α, 1+α] since ‖𝒲‖ <= 1), so it is
    solved against the labeled unit vectors: dense Cholesky when n <= dense_max_nodes, else a
    sparse LU if its fill stays small, else conjugate gradients on all l right-hand sides at once
    (module docstring). `method` forces one.
    """
    solver = InfluenceSolver(Wn, alpha, method, dense_max_nodes=dense_max_nodes, rtol=rtol)
    return solver.solve(_check_labeled(labeled, solver.n))


@dataclass
class SolveStats:
    """What `InfluenceSolver` reports (docs/design.md §10.2): the method, columns and blocks solved, the most
    CG iterations a block took (0 for a factorisation), the largest relative residual ‖M x − e‖ / ‖e‖,
    the seconds of the whole solve (set-up included), and for the sparse LU its nonzeros over the
    matrix's (`fill`) and the seconds its factorisation took; for the push (xclp.sparse_influence) its
    tolerance, the entries sent, and the largest and the summed share of a column's mass left out."""

    method: str
    columns: int = 0
    blocks: int = 0
    iterations: int = 0
    max_residual: float = 0.0
    fill: float = 0.0
    factor_seconds: float = 0.0
    seconds: float = 0.0
    tolerance: float = 0.0
    nonzeros: int = 0
    dropped_max: float = 0.0
    dropped_sum: float = 0.0

    def as_dict(self) -> dict[str, float | int | str]:
        out: dict[str, float | int | str] = {
            "method": self.method, "columns": self.columns, "blocks": self.blocks, "iterations": self.iterations,
            "max_relative_residual": float(f"{self.max_residual:.3e}"), "seconds": round(self.seconds, 3)}
        if self.fill:
            out.update(fill=round(self.fill, 2), factor_seconds=round(self.factor_seconds, 3))
        if self.tolerance:
            out.update(tolerance=self.tolerance, nonzeros=self.nonzeros,
                       dropped_max=round(self.dropped_max, 4),
                       dropped_mean=round(self.dropped_sum / self.columns, 4) if self.columns else 0.0)
            del out["iterations"], out["max_relative_residual"]
        return out


class InfluenceSolver:
    """S[:, columns] = (I − α𝒲)^{-1}[:, columns] block by block of columns (docs/design.md §10.2): the caller
    sends each block on and drops it, so all of S_L is never held. Each column's CG recurrence is its
    own, so a column comes out bit for bit as `influence_columns` gives it, in any block; so does a
    column of the sparse LU, solved alone (`_lu_columns`)."""

    def __init__(self, Wn: sp.spmatrix, alpha: float, method: InfluenceMethod = "auto", *,
                 dense_max_nodes: int = DENSE_MAX_NODES, rtol: float = 1e-12,
                 fill_max: float = SPARSE_FILL_MAX) -> None:
        if not 0.0 < float(alpha) < 1.0:
            raise InvalidInput(f"alpha must be strictly between 0 and 1, got {alpha!r}")
        if method not in ("auto", "dense", "sparse", "cg"):
            raise InvalidInput(f"method must be 'auto', 'dense', 'sparse' or 'cg', got {method!r}")
        Wn = sp.csr_matrix(Wn, dtype=np.float64)
        self.n = Wn.shape[0]
        if Wn.shape != (self.n, self.n) or self.n == 0:
            raise InvalidInput(f"Wn must be a non-empty square matrix, got shape {Wn.shape}")
        if abs(Wn - Wn.T).max() > 1e-12:
            raise InvalidInput("Wn must be symmetric; build it with normalise(knn_adjacency(...))")
        began, auto = time.perf_counter(), method == "auto"
        if auto:
            method = "dense" if self.n <= dense_max_nodes else "sparse"
        self.M = (sp.identity(self.n, format="csr") - float(alpha) * Wn).tocsr()
        self.rtol = rtol
        self._factor = (scipy.linalg.cho_factor(self.M.toarray(), lower=True, check_finite=False)
                        if method == "dense" else None)
        self._lu: spl.SuperLU | None = None
        fill = seconds = 0.0
        if method == "sparse":
            started = time.perf_counter()
            self._lu = _sparse_lu(self.M, fill_max if auto else SPARSE_FILL_FORCED)
            seconds = time.perf_counter() - started
            if self._lu is None:  # the factors would be denser than the bound allows
                if not auto:
                    raise InvalidInput(f"the sparse LU of this graph would hold more than {SPARSE_FILL_FORCED} "
                                       "times its nonzeros: solve it with solver = \"cg\" (or \"auto\")")
                method = "cg"  # CG is cheaper then
            else:
                fill = (self._lu.L.nnz + self._lu.U.nnz) / self.M.nnz
        self.stats = SolveStats(method, fill=fill, factor_seconds=seconds, seconds=time.perf_counter() - began)

    def _lu_columns(self, rhs: np.ndarray) -> np.ndarray:
        """The LU's solution of every column of `rhs`, each alone: SuperLU's solve of several right-hand
        sides at once goes through dense kernels whose rounding depends on how many there are (a
        column's last bits changed with the block), one at a time it does not; the columns share
        the process's cores (54 000 rows: 77 columns in 1.2 s on 2 threads, 1.7 s as one block)."""
        assert self._lu is not None
        lu, X = self._lu, np.empty_like(rhs)

        def one(j: int) -> None:
            X[:, j] = lu.solve(rhs[:, j])

        # SuperLU lets go of the GIL: a thread per core this process may use, at most 8
        with ThreadPoolExecutor(max_workers=min(8, default_workers()), thread_name_prefix="xclp-lu") as pool:
            list(pool.map(one, range(rhs.shape[1])))
        return X

    def solve(self, columns: np.ndarray) -> np.ndarray:
        """float64[n, c]: the influence columns `columns` (global row indices)."""
        began = time.perf_counter()
        idx = np.asarray(columns, dtype=np.int64)
        rhs = np.zeros((self.n, idx.size))
        rhs[idx, np.arange(idx.size)] = 1.0
        if self._factor is not None:
            X, iterations = scipy.linalg.cho_solve(self._factor, rhs, check_finite=False), 0
        elif self._lu is not None:
            X, iterations = self._lu_columns(rhs), 0
        else:
            X, iterations = _multi_cg(self.M, rhs, rtol=self.rtol, max_iter=max(1000, 10 * self.n))
        stats = self.stats
        stats.columns += idx.size
        stats.blocks += 1
        stats.iterations = max(stats.iterations, iterations)
        if idx.size:  # ‖e‖ = 1 for every column
            stats.max_residual = max(stats.max_residual, float(np.linalg.norm(self.M @ X - rhs, axis=0).max()))
        stats.seconds += time.perf_counter() - began
        return X


class PushSolver:
    """The sparse solve (docs/design.md §10.7, xclp.sparse_influence) block by block, as InfluenceSolver's:
    `stats` (method "push") adds up the columns, entries, seconds and the largest and summed share of
    a column's mass left out, for the run summary."""

    def __init__(self, W: sp.spmatrix, alpha: float, tolerance: float) -> None:
        began = time.perf_counter()
        self.pusher = Pusher(W, alpha, tolerance)
        self.stats = SolveStats("push", seconds=time.perf_counter() - began, tolerance=tolerance)

    def solve(self, columns: np.ndarray) -> SparseColumns:
        began, out, stats = time.perf_counter(), self.pusher.solve(columns), self.stats
        stats.columns, stats.blocks, stats.nonzeros = stats.columns + out.columns, stats.blocks + 1, \
            stats.nonzeros + int(out.indices.size)
        if out.columns:
            stats.dropped_max = max(stats.dropped_max, float(out.dropped.max()))
            stats.dropped_sum += float(out.dropped.sum())
        stats.seconds += time.perf_counter() - began
        return out


def _sparse_lu(M: sp.csr_matrix, fill_max: float) -> spl.SuperLU | None:
    """SuperLU's factors of the SPD matrix M (symmetric mode: minimum degree on the pattern of
    M + Mᵀ, diagonal pivots), or None when they would pass `fill_max` times M's nonzeros: SuperLU's
    incomplete factorisation is asked to keep every entry (drop_tol = 0) within that much fill, and
    what it returns is the exact factor only if it solves a fixed right-hand side exactly. (One
    code path whatever the bound, so that "auto" and a forced "sparse" give the same bits.)"""
    lu = spl.spilu(M.tocsc(), drop_tol=0.0, fill_factor=fill_max, permc_spec="MMD_AT_PLUS_A",
                   diag_pivot_thresh=0.0, options={"SymmetricMode": True})
    probe = np.linspace(1.0, 2.0, M.shape[0])
    residual = np.linalg.norm(M @ lu.solve(probe) - probe) / np.linalg.norm(probe)
    return lu if residual <= _EXACT_RESIDUAL else None


def _multi_cg(M: sp.csr_matrix, rhs: np.ndarray, *, rtol: float, max_iter: int) -> tuple[np.ndarray, int]:
    """Conjugate gradients for M X = rhs, all columns iterated together (one sparse × dense product per step).

    Each column runs its own CG recurrence (per-column scalars); a column whose residual norm is
    <= rtol·‖rhs column‖ is written out and dropped from the working set, so late iterations only
    touch the slow columns.
    """
    out = np.zeros_like(rhs)
    cols = np.arange(rhs.shape[1])
    X = np.zeros_like(rhs)
    R = rhs.copy()
    target = (rtol**2) * np.einsum("ij,ij->j", rhs, rhs)
    rs = np.einsum("ij,ij->j", R, R)
    P = R.copy()
    for iteration in range(max_iter):
        done = rs <= target
        if done.any():
            out[:, cols[done]] = X[:, done]
            keep = ~done
            cols, rs, target = cols[keep], rs[keep], target[keep]
            X = X[:, keep]  # one working array copied at a time: never more than eight float64[n, c]
            R = R[:, keep]
            P = P[:, keep]
        if cols.size == 0:
            return out, iteration
        MP = M @ P
        step = rs / np.einsum("ij,ij->j", P, MP)
        X += step * P
        R -= step * MP
        rs_new = np.einsum("ij,ij->j", R, R)
        P *= rs_new / rs
        P += R
        rs = rs_new
    raise InvalidInput(
        f"conjugate gradients did not reach rtol={rtol} in {max_iter} iterations; "
        "Wn must be a normalised symmetric adjacency (normalise(...)) and alpha < 1"
    )


@dataclass(frozen=True)
class Influence:
    """Everything the coordinator derives from H (docs/design.md §5.4).

    W: float64 csr[n, n] symmetric kNN adjacency; Wn: its normalisation 𝒲; labeled: int64[l] global
    row indices of labeled rows (ascending as given); S_L: float64[n, l] influence columns.
    """

    W: sp.csr_matrix
    Wn: sp.csr_matrix
    labeled: np.ndarray
    S_L: np.ndarray


def build_influence(
    H: np.ndarray,
    lsh_bits: int,
    labeled_idx: np.ndarray,
    params: GraphParams = GraphParams(),
    method: InfluenceMethod = "auto",
    candidates: np.ndarray | None = None,
    tolerance: float = 0.0,
) -> Influence:
    """Pooled H (party blocks in party order) -> graph (among `candidates` only, if given) -> S_L
    (the plaintext reference's path)."""
    return influence_of(knn_adjacency(H, lsh_bits, params, candidates), labeled_idx, params, method, tolerance)


def influence_of(W: sp.csr_matrix, labeled_idx: np.ndarray, params: GraphParams = GraphParams(),
                 method: InfluenceMethod = "auto", tolerance: float = 0.0) -> Influence:
    """The kNN adjacency W (from H, or folded without it: xclp.neighbours) -> 𝒲 -> S_L, exact, or with
    a tolerance pushed (xclp.sparse_influence) and held dense here (the reference's, for small graphs)."""
    Wn = normalise(W)
    labeled = _check_labeled(labeled_idx, W.shape[0])
    S_L = Pusher(W, params.alpha, tolerance).solve(labeled).dense() if tolerance else \
        influence_columns(Wn, labeled, params.alpha, method)
    return Influence(W=W, Wn=Wn, labeled=labeled, S_L=S_L)
