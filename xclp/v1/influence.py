"""A sparse "influence" piece on the wire (docs/design.md §10.7; xclp/sparse_influence.py makes the columns).

With a resolved influence_tolerance above 0 the coordinator sends each receiver its influence
columns, in its column order, as pieces of whole columns, each one uint32 array:

    [c, nnz_1 .. nnz_c, dropped_1 .. dropped_c, rows (Σ nnz, ascending within each column),
     values (Σ nnz)]

c columns (0 only for a receiver without labeled rows, then nothing follows); nnz_j the column's
entries; dropped_j its share of mass left out (xclp.sparse_influence) and the values as IEEE float32
bit patterns, little-endian like everything on the wire. A column's values are positive and at most
1/(1 − α), as every entry of (I − α𝒲)^{-1}; `unpack_piece` refuses anything
else, so a party folds only what could be influence columns.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from xclp.errors import InvalidInput
from xclp.sparse_influence import SparseColumns
from xclp.v1.xclp import INFLUENCE_PIECE_BYTES, SPARSE_INFLUENCE_DTYPE

_F32 = np.dtype("<f4")


def column_bytes(entries: int) -> int:
    """A column's words in a piece: its count and dropped share, a row and a value per entry."""
    return 8 + 8 * entries


def most_bytes(n: int) -> int:
    """The largest piece over `n` graph rows: INFLUENCE_PIECE_BYTES, or one column of n entries alone."""
    return max(INFLUENCE_PIECE_BYTES, 4 + column_bytes(n))


def empty_piece() -> np.ndarray:
    """The one piece of a receiver without labeled rows: no column."""
    return np.zeros(1, dtype=SPARSE_INFLUENCE_DTYPE)


def pack_pieces(columns: SparseColumns, piece_bytes: int = INFLUENCE_PIECE_BYTES) -> Iterator[np.ndarray]:
    """`columns` as pieces of whole columns, each within `piece_bytes` but for a column larger alone."""
    counts = np.diff(columns.indptr)
    start = 0
    while start < columns.columns:
        stop, size = start, 4
        while stop < columns.columns and (stop == start or size + column_bytes(int(counts[stop])) <= piece_bytes):
            size += column_bytes(int(counts[stop]))
            stop += 1
        lo, hi = int(columns.indptr[start]), int(columns.indptr[stop])
        yield np.concatenate([
            np.array([stop - start], dtype=np.uint32), counts[start:stop].astype(np.uint32),
            columns.dropped[start:stop].astype(_F32).view(np.uint32), columns.indices[lo:hi].astype(np.uint32),
            columns.values[lo:hi].astype(_F32).view(np.uint32)]).astype(SPARSE_INFLUENCE_DTYPE)
        start = stop


def unpack_piece(payload: object, n: int, bound: float) -> SparseColumns:
    """The columns of one piece over `n` graph rows; InvalidInput for anything malformed (a count
    that does not add up, a row out of range or not ascending, a value outside (0, bound], a
    dropped share outside [0, 1])."""
    if not isinstance(payload, np.ndarray) or payload.dtype != SPARSE_INFLUENCE_DTYPE or payload.ndim != 1 \
            or payload.size < 1:
        raise InvalidInput(f"a sparse influence piece must be a non-empty 1-D {SPARSE_INFLUENCE_DTYPE} array")
    c = int(payload[0])
    if payload.size < 1 + 2 * c:
        raise InvalidInput(f"a sparse influence piece of {payload.size} words cannot hold {c} columns")
    counts = payload[1 : 1 + c].astype(np.int64)
    nnz = int(counts.sum())
    if payload.size != 1 + 2 * c + 2 * nnz:
        raise InvalidInput(f"a sparse influence piece of {c} columns and {nnz} entries must be "
                           f"{1 + 2 * c + 2 * nnz} words, got {payload.size}")
    dropped = payload[1 + c : 1 + 2 * c].view(_F32).astype(np.float64)
    at = 1 + 2 * c
    rows = payload[at : at + nnz].astype(np.int64)
    values = payload[at + nnz :].view(_F32).astype(np.float64)
    if not (np.all(np.isfinite(dropped)) and np.all((dropped >= 0.0) & (dropped <= 1.0))):
        raise InvalidInput("a sparse influence piece's dropped shares must lie in [0, 1]")
    if not np.all(np.isfinite(values)) or (nnz and (values.min() <= 0.0 or values.max() > bound)):
        raise InvalidInput(f"a sparse influence piece has values outside (0, 1/(1 - alpha)] = (0, {bound:g}]: not "
                           "an influence matrix")
    if nnz and rows.max() >= n:
        raise InvalidInput(f"a sparse influence piece names rows beyond the graph's {n}")
    indptr = np.zeros(c + 1, dtype=np.int64)
    np.cumsum(counts, out=indptr[1:])
    steps = np.diff(rows)
    starts = indptr[1:-1]  # a column starts again wherever it likes
    within = np.ones(steps.size, dtype=bool)
    within[starts[(starts > 0) & (starts < nnz)] - 1] = False
    if np.any(steps[within] <= 0):
        raise InvalidInput("a sparse influence piece's rows must ascend within each column")
    return SparseColumns(n=n, indptr=indptr, indices=rows, values=values, dropped=dropped)
