"""The plaintext XCLP oracle: deterministic, split-invariant, consistent with its parts, strict on input."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from xclp.errors import InvalidInput
from xclp.graph import GraphParams, build_influence
from xclp.hamming import hamming_matrix
from xclp.lsh import lsh_codes, lsh_projection
from xclp.propagation import label_matrix, predict
from xclp.reference import xclp_reference

C = 3


def clustered(seed: int, n: int, d: int = 6) -> tuple[np.ndarray, np.ndarray]:
    """n rows around C well-separated centres; labels int64[n] in 0..C-1."""
    rng = np.random.default_rng(seed)
    centres = 5.0 * rng.standard_normal((C, d))
    y = rng.integers(0, C, size=n)
    return centres[y] + rng.standard_normal((n, d)), y.astype(np.int64)


def split(X: np.ndarray, y: np.ndarray, sizes: list[int]) -> list[tuple[np.ndarray, np.ndarray]]:
    cuts = np.cumsum(sizes)[:-1]
    return list(zip(np.split(X, cuts), np.split(y, cuts)))


def partially_labeled(seed: int, n: int = 60) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    X, y = clustered(seed, n)
    partial = np.where(np.random.default_rng(seed + 1).random(n) < 0.2, y, -1)
    partial[:C] = y[:C]  # at least a few labels
    return X, y, partial


def test_deterministic_for_a_seed_and_seed_sensitive() -> None:
    X, _, partial = partially_labeled(0)
    parties = split(X, partial, [25, 35])
    a = xclp_reference(parties, 11, C, 256, GraphParams(k=5))
    b = xclp_reference(parties, 11, C, 256, GraphParams(k=5))
    np.testing.assert_array_equal(a.H, b.H)
    np.testing.assert_array_equal(a.scores, b.scores)
    np.testing.assert_array_equal(a.labels, b.labels)
    assert not np.array_equal(a.codes, xclp_reference(parties, 12, C, 256, GraphParams(k=5)).codes)


def test_H_blocks_equal_per_party_hamming() -> None:
    X, _, partial = partially_labeled(1)
    parties = split(X, partial, [10, 30, 20])
    result = xclp_reference(parties, b"\x01" * 32, C, 128, GraphParams(k=4))
    projection = lsh_projection(b"\x01" * 32, 128, X.shape[1])
    codes = [lsh_codes(Xj, projection) for Xj, _ in parties]
    assert result.H.dtype == np.uint16
    for i in range(3):
        for j in range(3):
            np.testing.assert_array_equal(
                result.H[result.party_rows(i), result.party_rows(j)], hamming_matrix(codes[i], codes[j])
            )


def test_party_split_does_not_change_pooled_result() -> None:
    X, _, partial = partially_labeled(2)
    params = GraphParams(k=6)
    runs = [xclp_reference(split(X, partial, sizes), 5, C, 512, params) for sizes in ([60], [20, 40], [5, 15, 30, 10])]
    for other in runs[1:]:
        np.testing.assert_array_equal(other.H, runs[0].H)
        np.testing.assert_array_equal(other.influence.S_L, runs[0].influence.S_L)
        np.testing.assert_allclose(other.scores, runs[0].scores, rtol=1e-13, atol=1e-15)
        np.testing.assert_array_equal(other.labels, runs[0].labels)


def test_scores_are_sum_of_party_contributions() -> None:
    X, _, partial = partially_labeled(3)
    partial[40:] = -1  # party 2 (rows 40..59) has no labels
    result = xclp_reference(split(X, partial, [15, 25, 20]), 3, C, 256, GraphParams(k=5))
    inf = result.influence
    np.testing.assert_array_equal(inf.labeled, np.flatnonzero(partial != -1))
    np.testing.assert_allclose(sum(result.contributions), result.scores, atol=1e-15)
    np.testing.assert_allclose(result.scores, inf.S_L @ label_matrix(partial[inf.labeled], C), atol=1e-12)
    assert not result.contributions[2].any()
    assert result.party_labeled(2).size == 0
    np.testing.assert_array_equal(inf.labeled[result.party_labeled(1)], np.flatnonzero(partial[15:40] != -1) + 15)
    labels, confidence = predict(result.scores)
    np.testing.assert_array_equal(result.labels, labels)
    np.testing.assert_array_equal(result.confidence, confidence)
    # The oracle is exactly the chain of public steps.
    again = build_influence(result.H, 256, inf.labeled, GraphParams(k=5))
    np.testing.assert_array_equal(again.S_L, inf.S_L)


def test_normalised_labels_are_per_party() -> None:
    X, _, partial = partially_labeled(4)
    parties = split(X, partial, [30, 30])
    result = xclp_reference(parties, 4, C, 256, GraphParams(k=5), normalise_labels=True)
    S_L, labeled = result.influence.S_L, result.influence.labeled
    for j in range(2):
        own = result.party_labeled(j)
        expected = S_L[:, own] @ label_matrix(partial[labeled[own]], C, normalise=True)
        np.testing.assert_allclose(result.contributions[j], expected, atol=1e-15)


def test_pooled_normalisation_divides_by_counts_over_all_parties() -> None:
    X, _, partial = partially_labeled(4)
    parties = split(X, partial, [30, 30])
    result = xclp_reference(parties, 4, C, 256, GraphParams(k=5), normalise_labels="pooled")
    labeled = result.influence.labeled
    expected = result.influence.S_L @ label_matrix(partial[labeled], C, normalise=True)
    np.testing.assert_allclose(result.scores, expected, atol=1e-14)
    with pytest.raises(InvalidInput, match="'pooled'"):
        xclp_reference(parties, 4, C, 256, GraphParams(k=5), normalise_labels="global")  # type: ignore[arg-type]


def test_labels_cross_clients() -> None:
    """Party 0 labels only class 0, party 1 only class 1, party 2 only class 2: XCLP still gets all
    classes right on every party, which no party could do alone."""
    X, y = clustered(7, 90)
    parties = []
    for j in range(C):
        rows = np.flatnonzero(np.arange(90) % C == j)
        known = np.where((y[rows] == j) & (np.arange(rows.size) % 3 == 0), y[rows], -1)
        parties.append((X[rows], known))
    result = xclp_reference(parties, 9, C, 1024, GraphParams(k=5))
    truth = np.concatenate([y[np.arange(90) % C == j] for j in range(C)])
    assert np.mean(result.labels == truth) == 1.0
    assert np.all(result.confidence > 0.5)


Parties = list[tuple[np.ndarray, np.ndarray]]


def with_nan(p: Parties) -> Parties:
    X = p[0][0].copy()
    X[0, 3] = np.nan
    return [(X, p[0][1]), p[1]]


def narrower_party(p: Parties) -> Parties:
    return [p[0], (p[1][0][:, :5], p[1][1])]


def label_out_of_range(p: Parties) -> Parties:
    y = p[1][1].copy()
    y[2] = 7
    return [p[0], (p[1][0], y)]


def empty_party(p: Parties) -> Parties:
    return [p[0], (np.zeros((0, 6)), np.zeros(0, np.int64))]


def nothing_labeled(p: Parties) -> Parties:
    return [(X, np.full(y.size, -1)) for X, y in p]


def short_labels(p: Parties) -> Parties:
    return [p[0], (p[1][0], p[1][1][:-1])]


@pytest.mark.parametrize(
    ("mutate", "match"),
    [
        (with_nan, "party 0 features contain 1 NaN/inf values \\(first at row 0, column 3\\)"),
        (narrower_party, "party 1 has 5 feature columns but party 0 has 6"),
        (label_out_of_range, "party 1: label 7 at row 2 is out of range; allowed: 0..2 or -1"),
        (empty_party, "party 1 features has no rows"),
        (nothing_labeled, "no labeled rows at all"),
        (short_labels, "party 1: got 29 labels for 30 rows"),
        (lambda p: [], "non-empty sequence"),
        (lambda p: [p[0][0]], "party 0 must be a \\(features, labels\\) pair"),
    ],
)
def test_bad_input_is_refused_with_a_fix(mutate: Callable[[Parties], Parties], match: str) -> None:
    X, _, partial = partially_labeled(5)
    parties = split(X, partial, [30, 30])
    with pytest.raises(InvalidInput, match=match):
        xclp_reference(mutate(parties), 1, C, 128, GraphParams(k=3))


def test_k_and_bits_are_checked() -> None:
    X, _, partial = partially_labeled(6, n=12)
    parties = split(X, partial, [5, 7])
    with pytest.raises(InvalidInput, match="k = 12 .* n = 12; choose k <= 11"):
        xclp_reference(parties, 1, C, 128, GraphParams(k=12))
    with pytest.raises(InvalidInput, match="multiple of 64"):
        xclp_reference(parties, 1, C, 1000, GraphParams(k=3))
