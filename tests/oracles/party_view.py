"""What a party of a secure XCLP run should end with, from the plaintext reference (docs/design.md §5.5, §5.7).

The coordinator returns Z only for a party's unlabeled rows (all rows under hide_label_mask); on its
labeled rows the party keeps its own label, as one-hot scores with confidence 1.
"""

from __future__ import annotations

import numpy as np

from xclp.propagation import predict


def party_view(ref_scores: np.ndarray, y: np.ndarray, n_classes: int, *, hide_label_mask: bool = False
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(labels int64[n_j], confidence float64[n_j], scores float64[n_j, C]) from the reference's
    scores of the party's rows and its labels y int[n_j] (-1 = unlabeled)."""
    scores = np.array(ref_scores, dtype=np.float64, copy=True)
    if not hide_label_mask:
        labeled = np.flatnonzero(np.asarray(y) >= 0)
        scores[labeled] = np.eye(n_classes)[np.asarray(y)[labeled]]
    labels, confidence = predict(scores)
    return labels, confidence, scores
