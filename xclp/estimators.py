"""scikit-learn estimators of xclp's methods, for local experiments.

Before any institution is involved, a data scientist can try each method on pooled data with the
conventions every Python ML user knows (`fit`, `predict`, `predict_proba`, `get_params`, pipelines,
cross-validation):

- `LSHLabelSpreading`: XCLP's method on one table (Scott et al. 2023 Alg. 1 without the parties): LSH codes,
  the kNN graph on their Hamming distances, label propagation; `y = -1` marks unlabeled rows, as in
  sklearn.semi_supervised. What the federated job computes across parties, this computes on the
  rows it is given (the plaintext reference, xclp.reference, with one party).
- `FlyNNClassifier`: FlyNN (Ram & Sinha 2022): FlyHash and one Bloom filter per class.
- `RaceDensity`: RACE (Coleman & Shrivastava 2021): a kernel density estimate from an LSH count sketch.

`random_state` seeds the public structure (LSH projection, FlyHash, RACE's hashes) through
xclp.seeding, so a fitted estimator's structure equals the federated job's for the same seed
(an int seed; the service's common seed is 32 random bytes). They pass scikit-learn's
`check_estimator` (tests/xclp/test_estimators.py says which checks are skipped and why).

Needs scikit-learn (the extra `sklearn`: pip install 'xclp[sklearn]').
"""

from __future__ import annotations

import math
import os
from typing import Any

import numpy as np

try:
    from sklearn.base import BaseEstimator, ClassifierMixin
    from sklearn.utils.multiclass import check_classification_targets
    from sklearn.utils.validation import check_is_fitted, validate_data
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("xclp.estimators needs scikit-learn >= 1.6: pip install 'xclp[sklearn]'") from exc

from xclp.flynn import FlyHash, FlyNNModel, FlyNNParams, train_counts
from xclp.graph import GraphParams, build_influence, similarity
from xclp.hamming import hamming_matrix
from xclp.lsh import lsh_codes, lsh_projection
from xclp.race import RaceHashes, RaceParams, query, sketch
from xclp.seeding import Seed

UNLABELED = -1


def _seed(random_state: Any) -> Seed:
    """The public structure's seed: an int as given, a numpy Generator/RandomState drawn from,
    None fresh from the OS CSPRNG (a new structure every fit)."""
    if random_state is None:
        return os.urandom(32)
    if isinstance(random_state, (int, np.integer)) and not isinstance(random_state, bool):
        if not 0 <= int(random_state) < 2**64:
            raise ValueError(f"random_state must be in [0, 2^64), got {random_state}")
        return int(random_state)
    if isinstance(random_state, np.random.RandomState):
        return int(random_state.randint(0, 2**63 - 1, dtype=np.int64))
    if isinstance(random_state, np.random.Generator):
        return int(random_state.integers(0, 2**63 - 1))
    raise ValueError(f"random_state must be None, an int, a numpy Generator or RandomState, got {random_state!r}")


def _normalised(P: np.ndarray) -> np.ndarray:
    """Rows scaled to sum 1; a row with no mass becomes uniform."""
    total = P.sum(axis=1, keepdims=True)
    uniform = np.full_like(P, 1.0 / P.shape[1])
    return np.where(total > 0, P / np.where(total > 0, total, 1.0), uniform)


class _Classifier(ClassifierMixin, BaseEstimator):
    """A classifier whose `predict` is the class of largest `predict_proba` (ties: the first)."""

    classes_: np.ndarray

    def predict_proba(self, X: Any) -> np.ndarray:
        raise NotImplementedError

    def predict(self, X: Any) -> np.ndarray:
        check_is_fitted(self)
        return self.classes_[np.argmax(self.predict_proba(X), axis=1)]


class LSHLabelSpreading(_Classifier):
    """Label propagation on LSH codes: XCLP's method on one table.

    Parameters: lsh_bits (L, a multiple of 64), n_neighbors (k; at most n − 1 are used), alpha
    (propagation weight in (0, 1)), power (p of the clipped cosine), random_state (the LSH
    projection's seed). `fit(X, y)` takes y with -1 for unlabeled rows and sets `classes_`,
    `label_distributions_` (each training row's class distribution after propagation) and
    `transduction_` (its label). `predict_proba(X)` of new rows weighs the label distributions of
    their k nearest training rows in Hamming distance by the graph's edge weight.
    """

    def __init__(self, lsh_bits: int = 1024, n_neighbors: int = 10, alpha: float = 0.99, power: float = 3.0,
                 random_state: Any = None) -> None:
        self.lsh_bits = lsh_bits
        self.n_neighbors = n_neighbors
        self.alpha = alpha
        self.power = power
        self.random_state = random_state

    def fit(self, X: Any, y: Any) -> LSHLabelSpreading:
        X, y = validate_data(self, X, y, dtype=np.float64, ensure_min_samples=2)
        check_classification_targets(y)
        classes = np.unique(y)
        if classes.dtype.kind in "iuf":
            classes = classes[classes != UNLABELED]
        if classes.size == 0:
            raise ValueError("no labeled row: every label is -1 (unlabeled)")
        labeled = np.flatnonzero(np.isin(y, classes))
        params = GraphParams(min(int(self.n_neighbors), X.shape[0] - 1), float(self.alpha), float(self.power))
        self.classes_ = classes
        self.projection_ = lsh_projection(_seed(self.random_state), int(self.lsh_bits), X.shape[1])
        self.codes_ = lsh_codes(X, self.projection_)
        influence = build_influence(hamming_matrix(self.codes_), int(self.lsh_bits), labeled, params)
        Y = np.zeros((labeled.size, classes.size))
        Y[np.arange(labeled.size), np.searchsorted(classes, y[labeled])] = 1.0
        self.label_distributions_ = _normalised(np.maximum(influence.S_L @ Y, 0.0))
        self.transduction_ = classes[np.argmax(self.label_distributions_, axis=1)]
        self.n_neighbors_ = params.k
        return self

    def predict_proba(self, X: Any) -> np.ndarray:
        check_is_fitted(self)
        X = validate_data(self, X, dtype=np.float64, reset=False)
        H = hamming_matrix(lsh_codes(X, self.projection_), self.codes_)
        k = self.n_neighbors_
        nearest = np.argpartition(H, k - 1, axis=1)[:, :k] if k < H.shape[1] else np.tile(np.arange(H.shape[1]),
                                                                                          (H.shape[0], 1))
        weights = similarity(np.take_along_axis(H, nearest, axis=1), int(self.lsh_bits), float(self.power))
        return _normalised(np.einsum("qk,qkc->qc", weights, self.label_distributions_[nearest]))


class FlyNNClassifier(_Classifier):
    """FlyNN (Ram & Sinha 2022): m-dimensional FlyHash with s features per expansion row and rho winners,
    one Bloom filter per class with decay gamma. s = None takes ⌈d/2⌉ (at least 1), and rho is
    capped at m. `predict_proba` is each class's familiarity (rho minus FlyNN's novelty score)
    over their sum; `predict` its argmax (exact ties: the first class, where the federated job
    draws among them)."""

    def __init__(self, m: int = 1024, s: int | None = None, rho: int = 32, gamma: float = 0.0,
                 random_state: Any = None) -> None:
        self.m = m
        self.s = s
        self.rho = rho
        self.gamma = gamma
        self.random_state = random_state

    def fit(self, X: Any, y: Any) -> FlyNNClassifier:
        X, y = validate_data(self, X, y, dtype=np.float64)
        check_classification_targets(y)
        self.classes_, y_index = np.unique(y, return_inverse=True)
        if self.classes_.size < 2:
            raise ValueError(f"FlyNN needs at least 2 classes; got 1 class ({self.classes_[0]!r})")
        d = X.shape[1]
        s = max(1, math.ceil(d / 2)) if self.s is None else min(int(self.s), d)
        params = FlyNNParams(d, int(self.m), s, min(int(self.rho), int(self.m)), float(self.gamma))
        flyhash = FlyHash.from_seed(_seed(self.random_state), params)
        self.model_ = FlyNNModel(train_counts(flyhash, X, y_index, self.classes_.size), params.gamma, flyhash)
        return self

    def predict_proba(self, X: Any) -> np.ndarray:
        check_is_fitted(self)
        X = validate_data(self, X, dtype=np.float64, reset=False)
        novelty = self.model_.scores(X)
        return _normalised(np.maximum(self.model_.flyhash.params.rho - novelty, 0.0))


class RaceDensity(BaseEstimator):
    """RACE (Coleman & Shrivastava 2021): a kernel density estimate from an R × W sketch of LSH bucket counts
    (family "srp": the angular kernel (1 − θ/π)^p; "l2": p-stable with bucket width `bandwidth`).
    `score_samples(X)` is the log of the estimate per row (−inf where no sketched row shares a
    bucket), as sklearn.neighbors.KernelDensity's is of its density; `score(X)` their sum."""

    def __init__(self, rows: int = 100, width: int = 64, family: str = "srp", p: int = 1, bandwidth: float = 1.0,
                 random_state: Any = None) -> None:
        self.rows = rows
        self.width = width
        self.family = family
        self.p = p
        self.bandwidth = bandwidth
        self.random_state = random_state

    def fit(self, X: Any, y: Any = None) -> RaceDensity:
        X = validate_data(self, X, dtype=np.float64)
        params = RaceParams(int(self.rows), int(self.width), self.family, int(self.p),  # type: ignore[arg-type]
                            float(self.bandwidth))
        self.hashes_ = RaceHashes.from_seed(_seed(self.random_state), params, X.shape[1])
        self.sketch_ = sketch(self.hashes_, X)
        self.n_rows_ = X.shape[0]
        return self

    def score_samples(self, X: Any) -> np.ndarray:
        check_is_fitted(self)
        X = validate_data(self, X, dtype=np.float64, reset=False)
        with np.errstate(divide="ignore"):
            return np.log(query(self.sketch_, float(self.n_rows_), self.hashes_, X))

    def score(self, X: Any, y: Any = None) -> float:
        return float(self.score_samples(X).sum())
