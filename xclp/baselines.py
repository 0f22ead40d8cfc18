"""Plaintext baselines XCLP is compared with (Scott et al. 2023 §4.1): per-client LP and central exact LP.

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


def logistic_baseline(X: object, y: object, n_classes: int, *, l2: float = 1.0) -> np.ndarray:
    """int64[n]: a multinomial logistic regression trained on one party's own labeled rows (y ≥ 0),
    its classes for every row: the plain supervised model a party could fit without anyone, which
    `simulate` and `run --validate` show beside label propagation (a table whose labels a linear
    model separates well may not need propagation at all). Features are standardised by the
    labeled rows' mean and standard deviation; the L2 penalty `l2` (on the weights, not the
    intercepts) is scipy's L-BFGS-B's to minimise with the exact gradient (Hastie et al., The
    Elements of Statistical Learning, §4.4)."""
    from scipy.optimize import minimize

    X = check_features(X)
    y = check_labels(y, n_classes, n=X.shape[0])
    train = y >= 0
    classes = np.unique(y[train])
    if classes.size == 0:
        return np.zeros(X.shape[0], dtype=np.int64)
    if classes.size == 1:
        return np.full(X.shape[0], int(classes[0]), dtype=np.int64)
    mean, std = X[train].mean(axis=0), X[train].std(axis=0)
    Z = (X - mean) / np.where(std > 0, std, 1.0)
    A = np.hstack([Z[train], np.ones((int(train.sum()), 1))])
    Y = (y[train][:, None] == np.arange(n_classes)).astype(np.float64)
    d = A.shape[1]
    penalty = np.ones((d, n_classes))
    penalty[-1] = 0.0  # no penalty on the intercepts

    def loss(w: np.ndarray) -> tuple[float, np.ndarray]:
        W = w.reshape(d, n_classes)
        logits = A @ W
        logits -= logits.max(axis=1, keepdims=True)
        logp = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
        value = -float((Y * logp).sum()) + 0.5 * l2 * float((penalty * W * W).sum())
        grad = A.T @ (np.exp(logp) - Y) + l2 * penalty * W
        return value, grad.ravel()

    fitted = minimize(loss, np.zeros(d * n_classes), jac=True, method="L-BFGS-B", options={"maxiter": 500})
    W = fitted.x.reshape(d, n_classes)
    return np.argmax(np.hstack([Z, np.ones((X.shape[0], 1))]) @ W, axis=1).astype(np.int64)
