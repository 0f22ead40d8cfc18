"""Plaintext baselines XCLP is compared with (paper 003 §4.1): per-client LP and central exact LP.

Both run the same graph and propagation code as XCLP, on the exact cosine similarity
max(⟨u, v⟩/‖u‖‖v‖, 0)^p instead of its LSH estimate:
- `per_client_lp`: one party alone, on its own rows only (what a party can do without XCLP);
- `central_exact_lp`: all parties' data pooled in one place (the upper bound XCLP approximates).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import scipy.sparse as sp

from xclp.data.validation import UNLABELED, check_features, check_labels
from xclp.errors import InvalidInput
from xclp.graph import (
    GraphParams,
    InfluenceMethod,
    clipped_power,
    influence_columns,
    knn_from_similarity_rows,
    normalise,
)
from xclp.propagation import LabelNorm, label_matrix, label_norm_mode, predict, scores


@dataclass(frozen=True)
class LPResult:
    """Label propagation output, rows in input order: scores float64[n, C], labels int64[n],
    confidence float64[n]."""

    scores: np.ndarray
    labels: np.ndarray
    confidence: np.ndarray


def exact_cosine_adjacency(X: np.ndarray, params: GraphParams) -> sp.csr_matrix:
    """kNN adjacency W (float64 csr[n, n]) on exact cosine similarity of the rows of X float64[n, d]."""
    norms = np.linalg.norm(X, axis=1, keepdims=True)
    Xn = X / np.where(norms > 0.0, norms, 1.0)
    return knn_from_similarity_rows(lambda a, b: clipped_power(Xn[a:b] @ Xn.T, params.power), X.shape[0], params.k)


def _propagate(
    W: sp.csr_matrix,
    y: np.ndarray,
    n_classes: int,
    alpha: float,
    normalise_labels: bool | LabelNorm,
    method: InfluenceMethod,
) -> LPResult:
    # One data set: "party" and "pooled" normalisation coincide.
    by_class = label_norm_mode(normalise_labels) != "none"
    labeled = np.flatnonzero(y != UNLABELED)
    if labeled.size == 0:
        Z = np.zeros((y.size, n_classes))
    else:
        S_L = influence_columns(normalise(W), labeled, alpha, method)
        Z = scores(S_L, label_matrix(y[labeled], n_classes, by_class))
    labels, confidence = predict(Z)
    return LPResult(scores=Z, labels=labels, confidence=confidence)


def central_exact_lp(
    X: object,
    y: object,
    n_classes: int,
    params: GraphParams = GraphParams(),
    normalise_labels: bool | LabelNorm = False,
    method: InfluenceMethod = "auto",
) -> LPResult:
    """LP on pooled data X float[n, d], y int[n] (-1 = unlabeled) with exact cosine similarity."""
    X = check_features(X)
    y = check_labels(y, n_classes, n=X.shape[0])
    if not np.any(y != UNLABELED):
        raise InvalidInput("no labeled rows at all: give at least one row a label in 0..n_classes-1")
    return _propagate(exact_cosine_adjacency(X, params), y, n_classes, params.alpha, normalise_labels, method)


def per_client_lp(
    X: object,
    y: object,
    n_classes: int,
    params: GraphParams = GraphParams(),
    normalise_labels: bool | LabelNorm = False,
    method: InfluenceMethod = "auto",
) -> LPResult:
    """LP on one client's own rows X float[n_j, d], y int[n_j] (-1 = unlabeled), exact cosine.

    A small client keeps k = min(params.k, n_j − 1) neighbours (a single row has none). A client
    with no labeled rows cannot propagate anything: its scores are all zero, so every row gets
    label 0 with confidence 0 — the baseline's honest failure, counted as such in benchmarks.
    """
    X = check_features(X)
    y = check_labels(y, n_classes, n=X.shape[0])
    n = X.shape[0]
    if n == 1:
        W = sp.csr_matrix((1, 1), dtype=np.float64)
    else:
        W = exact_cosine_adjacency(X, replace(params, k=min(params.k, n - 1)))
    return _propagate(W, y, n_classes, params.alpha, normalise_labels, method)
