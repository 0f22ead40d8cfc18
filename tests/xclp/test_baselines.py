"""Baselines: per-client LP and central exact-cosine LP use the shared graph/propagation code."""

from __future__ import annotations

import numpy as np
import pytest

from xclp.baselines import central_exact_lp, exact_cosine_adjacency, per_client_lp
from xclp.errors import InvalidInput
from xclp.graph import GraphParams, influence_columns, normalise
from xclp.propagation import label_matrix, predict
from xclp.reference import xclp_reference


def data(seed: int, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    centres = 4.0 * rng.standard_normal((3, 5))
    y = rng.integers(0, 3, size=n).astype(np.int64)
    X = centres[y] + rng.standard_normal((n, 5))
    partial = np.where(rng.random(n) < 0.25, y, -1)
    partial[:3] = y[:3]
    return X, y, partial


def test_exact_adjacency_uses_clipped_cosine_power() -> None:
    X = np.array([[1.0, 0.0], [1.0, 1.0], [0.0, 1.0], [-1.0, 0.2]])
    W = exact_cosine_adjacency(X, GraphParams(k=1, power=2)).toarray()
    # Row picks: 0->1 (cos² = 0.5), 1->0 (tie with 2, smaller index), 2->1, 3->2 (cos = 0.196).
    # W = B + Bᵀ: the mutual pick 0<->1 counts twice.
    c3 = 0.2 / np.sqrt(1.04)
    expected = np.array([[0, 1.0, 0, 0], [1.0, 0, 0.5, 0], [0, 0.5, 0, c3**2], [0, 0, c3**2, 0]])
    np.testing.assert_allclose(W, expected, atol=1e-15)


def test_central_exact_lp_is_the_lp_chain() -> None:
    X, _, partial = data(0, 50)
    params = GraphParams(k=4, alpha=0.9)
    result = central_exact_lp(X, partial, 3, params)
    labeled = np.flatnonzero(partial != -1)
    S_L = influence_columns(normalise(exact_cosine_adjacency(X, params)), labeled, 0.9)
    np.testing.assert_allclose(result.scores, S_L @ label_matrix(partial[labeled], 3), atol=1e-14)
    np.testing.assert_array_equal(result.labels, predict(result.scores)[0])


def test_per_client_equals_central_on_one_client_and_handles_tiny_clients() -> None:
    X, _, partial = data(1, 30)
    np.testing.assert_array_equal(
        per_client_lp(X, partial, 3, GraphParams(k=4)).scores, central_exact_lp(X, partial, 3, GraphParams(k=4)).scores
    )
    small = per_client_lp(X[:4], partial[:4], 3, GraphParams(k=10))  # k clamped to 3
    assert small.labels.shape == (4,)
    single = per_client_lp(X[:1], np.array([2]), 3)
    np.testing.assert_array_equal(single.labels, [2])
    unlabeled = per_client_lp(X[5:9], np.full(4, -1), 3)
    np.testing.assert_array_equal(unlabeled.scores, np.zeros((4, 3)))
    np.testing.assert_array_equal(unlabeled.confidence, np.zeros(4))


def test_xclp_with_many_bits_tracks_central_exact() -> None:
    X, y, partial = data(2, 120)
    params = GraphParams(k=6)
    exact = central_exact_lp(X, partial, 3, params)
    lsh = xclp_reference([(X[:50], partial[:50]), (X[50:], partial[50:])], 3, 3, 4096, params)
    assert np.mean(lsh.labels == exact.labels) >= 0.97
    assert np.mean(exact.labels == y) >= 0.9


def test_bad_input() -> None:
    X, _, partial = data(3, 20)
    with pytest.raises(InvalidInput, match="no labeled rows at all"):
        central_exact_lp(X, np.full(20, -1), 3)
    with pytest.raises(InvalidInput, match="k = 20"):
        central_exact_lp(X, partial, 3, GraphParams(k=20))
    with pytest.raises(InvalidInput, match="out of range"):
        per_client_lp(X, np.full(20, 3), 3)
