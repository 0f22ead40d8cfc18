"""Each row's k nearest neighbours, folded block by block: the kNN graph without the n × n matrix
(docs/design.md §10.1).

The graph of docs/design.md §5.4 keeps, per row i, the k largest similarities max(cos(π·H_ij/L), 0)^p over
j ≠ i, ties going to the smaller column index, and drops picks of weight 0. Those k are also the k
best of the union of any partition of the columns, each part cut to its own k best first; so the
coordinator keeps per row only the k best candidates seen so far (`TopK`, O(n·k) memory), folds
each party's own k nearest rows (`own_top_k`, computed by the party on its codes) and each pair's
cross block as it is unmasked, and builds W from the candidates (`TopK.adjacency`): exactly the W
of `xclp.graph.knn_adjacency` on the whole H.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
from numba import njit, prange

from xclp.errors import InvalidInput
from xclp.graph import GraphParams, check_k, similarity
from xclp.hamming import hamming_dtype, popcount64
from xclp.lsh import check_lsh_bits

# Elements of a similarity block materialised at once (float64): rows are folded in slices of this size,
# so a fold's transient arrays stay near 8 MiB each whatever the pair's size.
_BLOCK_ELEMENTS = 1 << 20


def _cut(sim: np.ndarray, idx: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Per row, exactly the k best (sim desc, idx asc) of `sim`/`idx` (float64/int64[r, m], m >= k, each
    row's idx ascending), in column order: the values above the k-th largest, then the first ties."""
    kth = -np.partition(-sim, k - 1, axis=1)[:, k - 1 : k]  # the k-th largest value per row
    above = sim > kth
    at = sim == kth
    need = k - above.sum(axis=1, keepdims=True)
    keep = above | (at & (np.cumsum(at, axis=1, dtype=np.int32) <= need))
    rows = sim.shape[0]
    return sim[keep].reshape(rows, k), idx[keep].reshape(rows, k)


def _best(sim: np.ndarray, idx: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Per row, the k best (sim desc, idx asc) of `sim`/`idx` (float64/int64[r, m]), sorted best first."""
    order = np.lexsort((idx, -sim), axis=1)[:, :k]
    return np.take_along_axis(sim, order, axis=1), np.take_along_axis(idx, order, axis=1)


class TopK:
    """Per row of an n-row graph, the k best candidates seen so far (similarity, then smaller index)."""

    def __init__(self, n: int, lsh_bits: int, params: GraphParams) -> None:
        check_k(params.k, n)
        self.n, self.k = int(n), int(params.k)
        self.lsh_bits, self.power = check_lsh_bits(lsh_bits), params.power
        self.sim = np.full((self.n, self.k), -np.inf)
        self.idx = np.full((self.n, self.k), -1, dtype=np.int64)

    def fold_block(self, rows: slice, columns: slice, distances: np.ndarray) -> None:
        """Distances int[rows, columns] between rows `rows` and columns `columns` (global, disjoint)."""
        block = np.asarray(distances)
        shape = (rows.stop - rows.start, columns.stop - columns.start)
        if block.shape != shape:
            raise InvalidInput(f"a block of rows {rows.start}..{rows.stop} x columns {columns.start}..{columns.stop} "
                               f"has shape {shape}, got {block.shape}")
        if rows.start < columns.stop and columns.start < rows.stop:
            raise InvalidInput("a block's rows and columns must not overlap (a row is never its own neighbour)")
        step = max(1, _BLOCK_ELEMENTS // max(shape[1], 1))
        cols = np.arange(columns.start, columns.stop, dtype=np.int64)
        for start in range(0, shape[0], step):
            part = block[start : start + step]
            self.merge(rows.start + start, similarity(part, self.lsh_bits, self.power),
                        np.broadcast_to(cols, part.shape), ascending=True)

    def fold_lists(self, rows: slice, candidates: np.ndarray, distances: np.ndarray) -> None:
        """Per-row candidate lists: int[r, m] global column indices and their distances int[r, m]."""
        cand, dist = np.asarray(candidates, dtype=np.int64), np.asarray(distances)
        r = rows.stop - rows.start
        if cand.ndim != 2 or cand.shape[0] != r or dist.shape != cand.shape:
            raise InvalidInput(f"candidate lists for {r} rows must be two int[{r}, m] arrays, got {cand.shape} and "
                               f"{dist.shape}")
        if cand.size and (cand.min() < 0 or cand.max() >= self.n):
            raise InvalidInput(f"candidate indices must lie in 0..{self.n - 1}")
        if np.any(cand == np.arange(rows.start, rows.stop)[:, None]):
            raise InvalidInput("a row is never its own neighbour")
        if cand.shape[1] > 1 and np.any(np.diff(np.sort(cand, axis=1), axis=1) == 0):
            raise InvalidInput("a row's candidates must be distinct")
        self.merge(rows.start, similarity(dist, self.lsh_bits, self.power), cand)

    def fold_scattered(self, rows: np.ndarray, columns: np.ndarray, distances: np.ndarray,
                       keep: np.ndarray) -> None:
        """Distances int[m, r] between global rows `rows` and columns `columns` (each distinct, the two
        disjoint), folded into `rows` where `keep` (bool[m, r]): a candidate schedule's batch, whose
        rows and columns are anyone's (xclp.candidates.folded)."""
        rows, cols = np.asarray(rows, dtype=np.int64), np.asarray(columns, dtype=np.int64)
        block, keep = np.asarray(distances), np.asarray(keep, dtype=bool)
        if rows.ndim != 1 or cols.ndim != 1 or block.shape != (rows.size, cols.size) or keep.shape != block.shape:
            raise InvalidInput(f"a scattered block of {rows.size} rows x {cols.size} columns has shape {block.shape} "
                               f"and a mask of shape {keep.shape}")
        for name, idx in (("rows", rows), ("columns", cols)):
            if idx.size and (idx.min() < 0 or idx.max() >= self.n or np.unique(idx).size != idx.size):
                raise InvalidInput(f"a scattered block's {name} must be distinct and in 0..{self.n - 1}")
        if np.intersect1d(rows, cols).size:
            raise InvalidInput("a block's rows and columns must not overlap (a row is never its own neighbour)")
        sim = np.where(keep, similarity(block, self.lsh_bits, self.power), -np.inf)
        merged = _best(np.hstack([self.sim[rows], sim]), np.hstack([self.idx[rows], np.broadcast_to(cols, sim.shape)]),
                       self.k)
        self.sim[rows], self.idx[rows] = merged

    def merge(self, first: int, sim: np.ndarray, idx: np.ndarray, *, ascending: bool = False) -> None:
        """Fold candidates `idx` (their similarities `sim`) into rows first.. ; `ascending`: each row's
        idx ascending (a block's columns), which lets a wide block be cut to k per row first."""
        if sim.shape[1] == 0:
            return
        if ascending and sim.shape[1] > self.k:
            sim, idx = _cut(sim, idx, self.k)
        at = slice(first, first + sim.shape[0])
        self.sim[at], self.idx[at] = _best(np.hstack([self.sim[at], sim]), np.hstack([self.idx[at], idx]), self.k)

    def adjacency(self) -> sp.csr_matrix:
        """W = B + Bᵀ from the candidates (zero-weight picks dropped, zero diagonal): `knn_adjacency`'s W."""
        keep = self.sim > 0.0
        rows = np.repeat(np.arange(self.n), keep.sum(axis=1))
        B = sp.csr_matrix((self.sim[keep], (rows, self.idx[keep])), shape=(self.n, self.n))
        B.sort_indices()
        W = (B + B.T).tocsr()
        W.setdiag(0.0)
        W.eliminate_zeros()
        W.sort_indices()
        return W


def own_top_k(codes: np.ndarray, lsh_bits: int, params: GraphParams) -> tuple[np.ndarray, np.ndarray]:
    """A party's own k nearest rows per row (docs/design.md §10.1), by the graph's rule, without its n × n block.

    Returns (candidates uint32[n, k'], distances hamming_dtype[n, k']) with k' = min(k, n − 1), each
    row's best first, in the party's own row numbering. One pass of a numba kernel over each row's
    distances (`_own_top_k_kernel`): the similarity is a function of the distance alone, so each
    distance's rank among the similarities its values take (`similarity_ranks`) orders candidates
    exactly as the similarities do, equal similarities (every distance past L/2 gives 0) equal ranks.
    """
    codes = np.ascontiguousarray(codes)
    n = int(codes.shape[0])
    kk = min(int(params.k), n - 1)
    if kk <= 0:
        return np.zeros((n, 0), np.uint32), np.zeros((n, 0), hamming_dtype(lsh_bits))
    check_k(kk, n)
    if codes.ndim != 2 or codes.dtype != np.uint64 or 64 * codes.shape[1] != check_lsh_bits(lsh_bits):
        raise InvalidInput(f"codes must be uint64[n, {lsh_bits // 64}] for L = {lsh_bits}, got {codes.dtype}"
                           f"{list(codes.shape)}")
    idx = np.empty((n, kk), dtype=np.uint32)
    distances = np.empty((n, kk), dtype=hamming_dtype(lsh_bits))
    _own_top_k_kernel(codes, similarity_ranks(lsh_bits, params.power), idx, distances)
    return idx, distances


def similarity_ranks(lsh_bits: int, power: float) -> np.ndarray:
    """int64[L + 1]: per Hamming distance d, the rank of its similarity max(cos(π·d/L), 0)^p among
    those of 0..L, the largest 0; equal similarities share a rank (the floats of `similarity` itself)."""
    order = -similarity(np.arange(lsh_bits + 1), lsh_bits, power)
    return np.searchsorted(np.unique(order), order).astype(np.int64)


@njit(parallel=True, cache=True)
def _own_top_k_kernel(codes: np.ndarray, rank: np.ndarray, idx: np.ndarray,
                      dist: np.ndarray) -> None:  # pragma: no cover - compiled
    """Per row i, its k best other rows by (rank of the distance asc, row asc), best first."""
    n, words = codes.shape
    k = idx.shape[1]
    for i in prange(n):
        best_r = np.empty(k, np.int64)
        best_j = np.empty(k, np.int64)
        best_d = np.empty(k, np.int64)
        filled = 0
        for j in range(n):
            if j == i:
                continue
            d = 0
            for t in range(words):
                d += int(popcount64(codes[i, t] ^ codes[j, t]))
            r = rank[d]
            if filled == k:
                if r >= best_r[k - 1]:  # not better; an equal rank goes to the smaller row, seen first
                    continue
                pos = k - 1
            else:
                pos = filled
                filled += 1
            while pos > 0 and best_r[pos - 1] > r:
                best_r[pos], best_j[pos], best_d[pos] = best_r[pos - 1], best_j[pos - 1], best_d[pos - 1]
                pos -= 1
            best_r[pos], best_j[pos], best_d[pos] = r, j, d
        for t in range(k):
            idx[i, t] = best_j[t]
            dist[i, t] = best_d[t]
