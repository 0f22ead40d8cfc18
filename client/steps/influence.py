"""A party's influence columns as they arrive (docs/design.md §5.5, §10.2, §10.7): each piece checked,
then folded into Z̄^{(j)} = S_L^{(j)} Y_L^{(j)} at once, exact and dense or pushed and sparse
(xclp.sparse_influence, xclp.v1.influence)."""

from __future__ import annotations

import numpy as np

from xclp.data.validation import UNLABELED, check_labels
from xclp.errors import InvalidInput, ProtocolError
from xclp.privacy import label_dp
from xclp.propagation import label_matrix
from xclp.sparse_influence import SparseColumns
from xclp.v1.influence import unpack_piece
from xclp.v1.xclp import INFLUENCE_DTYPE, LABELED_DTYPE


def labeled_rows(y: object, n_classes: int) -> np.ndarray:
    """int64[l_j]: the party's labeled row numbers, ascending (what the coordinator learns, docs/design.md §2)."""
    return np.flatnonzero(check_labels(y, n_classes) != UNLABELED).astype(LABELED_DTYPE)


def select_influence(block: np.ndarray, y: object, n_classes: int, *, hide_label_mask: bool) -> np.ndarray:
    """S_L^{(j)}: float64[n, l_j], the influence columns of the party's labeled rows (docs/design.md §5.5).

    With `hide_label_mask` the coordinator sent the columns of all n_j rows (float64[n, n_j]) and
    the party keeps its labeled ones here, so the coordinator never learns which rows are labeled.
    """
    own = labeled_rows(y, n_classes)
    S = np.asarray(block, dtype=np.float64)
    expected = own.size if not hide_label_mask else np.asarray(y).shape[0]
    if S.ndim != 2 or S.shape[1] != expected or not np.all(np.isfinite(S)):
        raise InvalidInput(f"influence block must be finite float64[n, {expected}], got shape {S.shape}")
    return S[:, own] if hide_label_mask else S


def influence_piece(payload: object, n: int, alpha: float, tolerance: float) -> np.ndarray | SparseColumns:
    """One influence piece as the coordinator sent it, checked: float64[n, c] (exact), or with a
    tolerance sparse columns (xclp.v1.influence); ProtocolError if it could not be influence columns:
    S = (I − α𝒲)⁻¹ is entrywise non-negative and at most 1/(1 − α) (‖𝒲‖ ≤ 1)."""
    bound = 1.0 / (1.0 - alpha)
    if tolerance:
        try:
            return unpack_piece(payload, n, bound)
        except InvalidInput as exc:
            raise ProtocolError(f"the coordinator sent a malformed influence piece: {exc}") from None
    if not isinstance(payload, np.ndarray) or payload.dtype != INFLUENCE_DTYPE or payload.ndim != 2 \
            or payload.shape[0] != n:
        raise ProtocolError(f"an influence piece must be {INFLUENCE_DTYPE}[{n}, ...]")
    if payload.min(initial=0.0) < 0 or payload.max(initial=0.0) > bound:
        raise ProtocolError(f"the influence block has values outside [0, 1/(1 - alpha)] = [0, {bound:g}]: not an "
                            "influence matrix")
    return payload


class InfluenceScores:
    """Z̄^{(j)} = S_L^{(j)} Y_L^{(j)} accumulated over the influence pieces as they arrive, in column
    order (docs/design.md §10.2): the party never holds all of S_L. With `hide_label_mask` the pieces cover
    all its rows and it keeps its labeled ones (`select_influence`'s choice, piece by piece)."""

    def __init__(self, y: object, n_classes: int, n_graph: int, *, hide_label_mask: bool,
                 normalise_labels: bool, own: slice | None = None) -> None:
        labels = check_labels(y, n_classes)
        self.labeled = labels != UNLABELED
        self.position = np.cumsum(self.labeled) - 1  # a labeled row's row of Y_L
        self.hide = hide_label_mask
        self.expected = labels.size if hide_label_mask else int(self.labeled.sum())
        self.Y = (label_matrix(labels[self.labeled], n_classes, normalise_labels) if self.labeled.any()
                  else np.zeros((0, n_classes)))
        self.zbar = np.zeros((n_graph, n_classes))
        self.received = 0
        # with `own` (this party's graph rows, which it keeps): (c₂, c₁) of the columns received so
        # far on the other rows, for label-DP's Skellam noise (xclp.privacy.label_dp); no pass over them without
        self.own = own
        self.largest_columns = (0.0, 0.0)
        self.dropped = (0.0, 0.0)  # sparse columns (xclp.sparse_influence): the largest and the summed share left out

    @property
    def approximation(self) -> dict[str, float | int]:
        """What sparse columns left out (docs/design.md §10.7): every class column of Z̄ keeps at least
        1 − dropped_max of its degree-weighted mass, and loses nothing anywhere else (the push never adds)."""
        return {"columns": self.received, "dropped_max": round(self.dropped[0], 6),
                "dropped_mean": round(self.dropped[1] / self.received, 6) if self.received else 0.0}

    @property
    def complete(self) -> bool:
        return self.received == self.expected

    def add(self, piece: np.ndarray | SparseColumns) -> None:
        """One piece, float64[n, c] or sparse (xclp.v1.influence): the next c of this party's columns."""
        S = piece.matrix() if isinstance(piece, SparseColumns) else np.asarray(piece, dtype=np.float64)
        finite = not isinstance(S, np.ndarray) or bool(np.all(np.isfinite(S)))  # (unpack_piece checked sparse ones)
        if S.ndim != 2 or S.shape[0] != self.zbar.shape[0] or not finite:
            raise InvalidInput(f"an influence piece must be finite float64[{self.zbar.shape[0]}, c], got {S.shape}")
        stop = self.received + S.shape[1]
        if stop > self.expected:
            raise InvalidInput(f"influence pieces for {stop} columns, but this party has {self.expected}")
        if self.hide:  # columns are own rows received..stop; Y_L's rows are the labeled ones among them
            labeled = self.labeled[self.received : stop]
            self.zbar += S[:, np.flatnonzero(labeled)] @ self.Y[self.position[self.received : stop][labeled]]
        else:
            self.zbar += S @ self.Y[self.received : stop]
        self.received = stop
        if isinstance(piece, SparseColumns) and piece.columns:
            self.dropped = (max(self.dropped[0], float(piece.dropped.max())),
                            self.dropped[1] + float(piece.dropped.sum()))
        if self.own is not None:
            l2, l1 = label_dp.largest_columns(S, self.own)
            self.largest_columns = (max(self.largest_columns[0], l2), max(self.largest_columns[1], l1))


