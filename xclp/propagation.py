"""The party side of label propagation: label matrices, scores and predictions (DESIGN §5.6-5.7).

Z = Σ_j S_L^{(j)} Y_L^{(j)} (paper 003 §3.1 Phase 3); a party turns its rows of Z into a label
ŷ = argmax_c Z_ic and a confidence ω = 1 − entropy(Z_i⁺ / Σ Z_i⁺) / log C (Alg. 1 lines 12-13).
"""

from __future__ import annotations

import numpy as np

from xclp.errors import InvalidInput
from xclp.validation import check_labels


def label_matrix(y_labeled: object, n_classes: int, normalise: bool = False) -> np.ndarray:
    """Y_L: float64[l, C] for labels int[l] in 0..C−1 (no unlabeled rows here).

    normalise=False: one-hot rows (the paper). normalise=True: each class column divided by that
    class's count in `y_labeled` (the authors' code), so every present class carries total mass 1
    and frequent classes do not drown rare ones; absent classes stay zero columns.
    """
    y = check_labels(y_labeled, n_classes, allow_unlabeled=False)
    Y = np.zeros((y.size, n_classes), dtype=np.float64)
    Y[np.arange(y.size), y] = 1.0
    if normalise:
        counts = Y.sum(axis=0)
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
