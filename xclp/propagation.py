"""The party side of label propagation: label matrices, scores and predictions (docs/design.md §5.6-5.7).

Z = Σ_j S_L^{(j)} Y_L^{(j)} (Scott et al. 2023 §3.1 Phase 3); a party turns its rows of Z into a label
ŷ = argmax_c Z_ic and a confidence ω = 1 − entropy(Z_i⁺ / Σ Z_i⁺) / log C (Alg. 1 lines 12-13).
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from xclp.data.validation import check_labels
from xclp.errors import InvalidInput

LabelNorm = Literal["none", "party", "pooled"]


def label_norm_mode(normalise: bool | str) -> LabelNorm:
    """Canonical label normalisation: False -> "none", True -> "party"; "none"/"party"/"pooled" pass.

    "party": each party divides by its own class counts (all it can compute alone, docs/design.md §5.6);
    "pooled": everyone divides by the class counts over all parties' labeled rows (the authors'
    pooled code; federated, it needs the total counts from a secure sum).
    """
    if normalise is False or normalise == "none":
        return "none"
    if normalise is True or normalise == "party":
        return "party"
    if normalise == "pooled":
        return "pooled"
    raise InvalidInput(f"label normalisation must be False, True, 'none', 'party' or 'pooled', got {normalise!r}")


def label_matrix(
    y_labeled: object, n_classes: int, normalise: bool = False, class_counts: np.ndarray | None = None
) -> np.ndarray:
    """Y_L: float64[l, C] for labels int[l] in 0..C−1 (no unlabeled rows here).

    normalise=False: one-hot rows (the paper). normalise=True: each class column divided by that
    class's count (the authors' code), so every class carries the same total mass and frequent
    classes do not drown rare ones. The count is taken from `y_labeled` itself, or from
    `class_counts` int[C] (e.g. pooled over all parties) when given. Absent classes stay zero.
    """
    y = check_labels(y_labeled, n_classes, allow_unlabeled=False)
    Y = np.zeros((y.size, n_classes), dtype=np.float64)
    Y[np.arange(y.size), y] = 1.0
    if normalise:
        own = Y.sum(axis=0)
        counts = own if class_counts is None else np.asarray(class_counts, dtype=np.float64)
        if counts.shape != (n_classes,) or np.any(counts < own):
            raise InvalidInput(
                f"class_counts must be {n_classes} counts, each at least the number of labeled rows of that "
                f"class here ({own.astype(np.int64).tolist()}), got {np.asarray(class_counts).tolist()}"
            )
        Y /= np.where(counts > 0.0, counts, 1.0)
    return Y


def scores(S_L: np.ndarray, Y_L: np.ndarray) -> np.ndarray:
    """Z̄ = S_L Y_L: float64[n, C] from influence columns float64[n, l] and labels float64[l, C]."""
    S_L = np.asarray(S_L, dtype=np.float64)
    Y_L = np.asarray(Y_L, dtype=np.float64)
    if S_L.ndim != 2 or Y_L.ndim != 2:
        raise InvalidInput(f"S_L and Y_L must be 2-D, got shapes {S_L.shape} and {Y_L.shape}")
    if S_L.shape[1] != Y_L.shape[0]:
        raise InvalidInput(
            f"S_L has {S_L.shape[1]} labeled columns but Y_L has {Y_L.shape[0]} rows; "
            "pass the columns of S in the order of the labeled rows"
        )
    return S_L @ Y_L


def predict(Z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Labels int64[n] and confidences float64[n] in [0, 1] from scores float64[n, C].

    ŷ = argmax_c Z_ic, ties to the smallest class. ω = 1 − entropy(p)/log C with p = Z⁺/ΣZ⁺ (Z
    clipped at 0 first: fixed-point error may leave tiny negatives); an all-zero row reads as
    uniform, confidence 0.
    """
    Z = np.asarray(Z, dtype=np.float64)
    if Z.ndim != 2 or Z.shape[1] < 2:
        raise InvalidInput(f"scores must be float[n, C] with C >= 2 classes, got shape {Z.shape}")
    if not np.all(np.isfinite(Z)):
        raise InvalidInput("scores contain NaN/inf")
    labels = np.argmax(Z, axis=1).astype(np.int64)
    Zp = np.maximum(Z, 0.0)
    total = Zp.sum(axis=1, keepdims=True)
    n_classes = Z.shape[1]
    p = np.where(total > 0.0, Zp / np.where(total > 0.0, total, 1.0), 1.0 / n_classes)
    plogp = np.where(p > 0.0, p * np.log(np.where(p > 0.0, p, 1.0)), 0.0)  # 0·log 0 = 0
    confidence = 1.0 - (-plogp.sum(axis=1)) / np.log(n_classes)
    confidence[total[:, 0] == 0.0] = 0.0  # exactly 0, not 1 − log C / log C rounding
    return labels, np.clip(confidence, 0.0, 1.0)
