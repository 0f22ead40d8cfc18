"""RACE: additive sketches, LSH collision laws, KDE accuracy, classifier, private release, bad input."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from tests.oracles.race_numpy import buckets_numpy, counts_numpy
from xclp.errors import InvalidInput
from xclp.race import (
    RaceClassifier,
    RaceHashes,
    RaceParams,
    exact_kde,
    lsh_kernel,
    private_release,
    private_release_share,
    query,
    sketch,
)

SRP = RaceParams(rows=64, width=8, family="srp", p=3)
L2 = RaceParams(rows=64, width=50, family="l2", bandwidth=2.0)


def gaussian(n: int, dim: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, dim))


def at_angle(theta: float, dim: int, seed: int) -> np.ndarray:
    """Two unit vectors in R^dim at angle theta, in a random plane."""
    q, _ = np.linalg.qr(np.random.default_rng(seed).standard_normal((dim, 2)))
    u, v = q[:, 0], q[:, 1]
    return np.stack([u, np.cos(theta) * u + np.sin(theta) * v])


@pytest.mark.parametrize("params", [SRP, L2])
def test_sketches_of_two_halves_add_up_to_the_sketch_of_the_whole(params: RaceParams) -> None:
    X = gaussian(301, 6, 0)
    hashes = RaceHashes.from_seed(3, params, 6)
    whole = sketch(hashes, X)
    assert whole.dtype == np.int64 and whole.shape == (params.rows, params.width)
    assert np.all(whole.sum(axis=1) == 301)
    assert np.array_equal(sketch(hashes, X[:150]) + sketch(hashes, X[150:]), whole)


@pytest.mark.parametrize("params", [SRP, L2])
def test_hashes_are_a_function_of_the_seed(params: RaceParams) -> None:
    X = gaussian(20, 6, 1)
    a, b, c = (RaceHashes.from_seed(s, params, 6).buckets(X) for s in (1, 1, 2))
    assert np.array_equal(a, b) and not np.array_equal(a, c)
    assert a.min() >= 0 and a.max() < params.width


@pytest.mark.parametrize("p", [1, 2, 4])
@pytest.mark.parametrize("theta", [0.3, 1.2, 2.5])
def test_srp_collision_probability_is_one_minus_theta_over_pi_to_the_p(p: int, theta: float) -> None:
    rows = 4000
    pair = at_angle(theta, 10, seed=int(theta * 10) + p)
    buckets = RaceHashes.from_seed(5, RaceParams(rows, 2**p, "srp", p=p), 10).buckets(pair)
    hits = int(np.sum(buckets[0] == buckets[1]))
    expected = (1 - theta / np.pi) ** p
    assert stats.binomtest(hits, rows, expected).pvalue > 1e-3
    np.testing.assert_allclose(lsh_kernel(RaceParams(rows, 2**p, "srp", p=p), pair[:1], pair[1:]), [[expected]])


@pytest.mark.parametrize("distance", [0.5, 2.0, 5.0])
def test_l2_collision_probability_matches_the_p_stable_formula(distance: float) -> None:
    # W large: the universal hash adds false collisions only with probability ~1/W.
    params = RaceParams(rows=4000, width=1_000_000, family="l2", bandwidth=2.0)
    pair = np.stack([np.zeros(4), np.array([distance, 0, 0, 0]) + 10.0])
    pair[0] += 10.0
    buckets = RaceHashes.from_seed(6, params, 4).buckets(pair)
    hits = int(np.sum(buckets[0] == buckets[1]))
    expected = float(lsh_kernel(params, pair[:1], pair[1:])[0, 0])
    assert stats.binomtest(hits, params.rows, expected).pvalue > 1e-3


def test_l2_kernel_known_values() -> None:
    params = RaceParams(rows=1, width=10, family="l2", bandwidth=1.0)
    k = lsh_kernel(params, np.array([[0.0], [1.0], [1e6]]), np.array([[0.0]]))[0]
    # c = r: 1 - 2Φ(-1) - 2/√(2π)·(1 - e^{-1/2}), with 2Φ(-1) = erfc(1/√2)
    at_r = 1 - math.erfc(1 / math.sqrt(2)) - 2 / math.sqrt(2 * math.pi) * (1 - math.exp(-0.5))
    assert at_r == pytest.approx(0.368746, abs=1e-6)
    np.testing.assert_allclose(k, [1.0, at_r, 0.0], atol=1e-6)


def test_l2_universal_hash_handles_negative_values() -> None:
    X = gaussian(100, 3, 2) - 1e4  # every ⌊(a·x + b)/r⌋ is a large negative integer
    buckets = RaceHashes.from_seed(1, L2, 3).buckets(X)
    assert buckets.min() >= 0 and buckets.max() < L2.width
    assert len(np.unique(buckets)) > 1


@pytest.mark.parametrize(
    "params",
    [RaceParams(2000, 4, "srp", p=2), RaceParams(2000, 100_000, "l2", bandwidth=3.0)],
)
def test_kde_estimate_is_close_to_the_exact_kernel_sum(params: RaceParams) -> None:
    X, Q = gaussian(400, 5, 3), gaussian(30, 5, 4)
    hashes = RaceHashes.from_seed(7, params, 5)
    S = sketch(hashes, X)
    exact = exact_kde(params, X, Q)
    mean = query(S, 400, hashes, Q)
    assert np.max(np.abs(mean - exact)) < 0.03
    assert np.mean(np.abs(mean - exact)) < 0.01
    mom = query(S, None, hashes, Q, estimator="median_of_means", groups=10)
    assert np.max(np.abs(mom - exact)) < 0.04
    np.testing.assert_array_equal(query(S, None, hashes, Q), mean)  # N̂ = ΣS/R is exact for raw counts


def test_classifier_separates_blobs_and_its_sketches_sum_to_the_pooled_sketch() -> None:
    rng = np.random.default_rng(5)
    y = rng.integers(0, 3, 600)
    centres = 4.0 * np.eye(3, 6)
    X = centres[y] + rng.normal(0, 0.7, (600, 6))
    hashes = RaceHashes.from_seed(8, RaceParams(200, 500, "l2", bandwidth=2.0), 6)
    clf = RaceClassifier.fit(hashes, X[:400], y[:400], 3)
    assert np.array_equal(clf.sketches.sum(axis=0), sketch(hashes, X[:400]))
    assert np.mean(clf.predict(X[400:]) == y[400:]) >= 0.95
    parts = [RaceClassifier.fit(hashes, X[i : i + 200], y[i : i + 200], 3).sketches for i in (0, 200)]
    assert np.array_equal(parts[0] + parts[1], clf.sketches)


def test_private_release_adds_laplace_R_over_epsilon() -> None:
    params = RaceParams(rows=50, width=40, family="srp", p=3)
    S = sketch(RaceHashes.from_seed(1, params, 4), gaussian(1000, 4, 6))
    eps = 2.0
    noise = (private_release(S, eps, source=np.random.default_rng(0)) - S).ravel()
    scale = params.rows / eps
    assert stats.kstest(noise, stats.laplace(scale=scale).cdf).pvalue > 1e-3
    # The authors' R/(Nε) is detected as far too little noise.
    assert stats.kstest(noise, stats.laplace(scale=scale / 1000).cdf).pvalue < 1e-6


def test_distributed_shares_sum_to_two_sided_geometric_of_scale_R_over_epsilon() -> None:
    """Any τ − 1 of the τ shares carry the geometric of scale R/ε (docs/design.md §6); all τ, τ/(τ−1) of it."""
    S = np.zeros((20, 100), dtype=np.int64)
    rng = np.random.default_rng(1)
    eps, tau = 4.0, 3
    shares = [private_release_share(S, eps, tau, source=rng) for _ in range(tau)]
    others, total = sum(shares[1:]), sum(shares)
    assert total.dtype == np.int64
    q = np.exp(-eps / 20)
    variance = 2 * q / (1 - q) ** 2  # of P(k) ∝ q^|k|
    assert abs(others.var() / variance - 1) < 0.15
    assert abs(total.var() / (variance * tau / (tau - 1)) - 1) < 0.15
    assert abs(total.mean()) < 4 * np.sqrt(variance / total.size)


# --- bad input -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(rows=0, width=8), r"rows \(R\) must be a positive integer"),
        (dict(rows=4, width=7, family="srp", p=3), "cannot hold the 2\\^p = 8 SRP buckets"),
        (dict(rows=4, width=8, family="cosine"), "family must be 'srp'"),
        (dict(rows=4, width=8, family="l2", bandwidth=0.0), "bandwidth r of the L2 LSH must be finite and > 0"),
        (dict(rows=4, width=8, family="l2", bandwidth=float("nan")), "must be finite and > 0"),
        (dict(rows=4, width=2**30, family="srp", p=30), "too many"),
        (dict(rows=4, width=8.5), r"width \(W\) must be a positive integer"),
    ],
)
def test_invalid_params_are_refused(kwargs: dict, message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        RaceParams(**kwargs)


@pytest.mark.parametrize(
    ("X", "message"),
    [
        (np.full((2, 4), np.nan), "NaN/inf"),
        (np.array([[1.0, np.inf, 0.0, 0.0]]), "NaN/inf"),
        (np.ones((2, 3)), "3 columns but 4 were expected"),
        (np.ones((0, 4)), "no rows"),
        (np.ones(4), "2-D array"),
    ],
)
def test_bad_data_is_refused(X: np.ndarray, message: str) -> None:
    hashes = RaceHashes.from_seed(1, SRP, 4)
    with pytest.raises(InvalidInput, match=message):
        sketch(hashes, X)
    with pytest.raises(InvalidInput, match=message):
        query(np.zeros((SRP.rows, SRP.width)), 10, hashes, X)


def test_bad_queries_are_refused() -> None:
    hashes = RaceHashes.from_seed(1, SRP, 4)
    S = sketch(hashes, gaussian(10, 4, 0))
    Q = gaussian(2, 4, 1)
    with pytest.raises(InvalidInput, match="needs groups"):
        query(S, 10, hashes, Q, estimator="median_of_means")
    with pytest.raises(InvalidInput, match="groups = 65 exceeds the 64 rows"):
        query(S, 10, hashes, Q, estimator="median_of_means", groups=65)
    with pytest.raises(InvalidInput, match="only applies to estimator='median_of_means'"):
        query(S, 10, hashes, Q, groups=4)
    with pytest.raises(InvalidInput, match="estimator must be 'mean' or 'median_of_means'"):
        query(S, 10, hashes, Q, estimator="max")  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match="n .* must be a positive number"):
        query(S, 0, hashes, Q)
    with pytest.raises(InvalidInput, match=r"shape \(64, 9\) but these hashes need"):
        query(np.zeros((64, 9)), 10, hashes, Q)
    with pytest.raises(InvalidInput, match="NaN/inf"):
        query(np.full((64, 8), np.nan), 10, hashes, Q)


def test_bad_classifier_input_is_refused() -> None:
    hashes = RaceHashes.from_seed(1, SRP, 4)
    X = gaussian(5, 4, 0)
    with pytest.raises(InvalidInput, match="label 2 at row 4 is out of range"):
        RaceClassifier.fit(hashes, X, np.array([0, 1, 0, 1, 2]), 2)
    with pytest.raises(InvalidInput, match="n_classes >= 2"):
        RaceClassifier(hashes, np.zeros((1, SRP.rows, SRP.width)))


def test_bad_release_arguments_are_refused() -> None:
    S = np.zeros((4, 8), dtype=np.int64)
    with pytest.raises(InvalidInput, match="epsilon must be finite and > 0"):
        private_release(S, 0.0)
    with pytest.raises(InvalidInput, match="raw, non-negative counts"):
        private_release(S - 1, 1.0)
    with pytest.raises(InvalidInput, match="non-empty 2-D array"):
        private_release(np.zeros(8), 1.0)
    with pytest.raises(InvalidInput, match="integer counts from sketch"):
        private_release_share(S.astype(float), 1.0, 2)
    with pytest.raises(InvalidInput, match="n_parties must be a positive integer"):
        private_release_share(S, 1.0, 0)


def test_dimension_must_be_positive() -> None:
    with pytest.raises(InvalidInput, match="dim must be a positive integer"):
        RaceHashes.from_seed(1, SRP, 0)


@pytest.mark.parametrize("params", [RaceParams(rows=37, width=16, family="srp", p=4),
                                    RaceParams(rows=50, width=8, family="srp", p=1),
                                    RaceParams(rows=29, width=13, family="l2", bandwidth=0.7)])
@pytest.mark.parametrize("n", [1, 3, 4, 5, 257])
def test_the_kernels_give_the_buckets_and_counts_of_the_plain_numpy_hashing(params: RaceParams, n: int) -> None:
    """Every row count, not a multiple of the four rows hashed at once, and both families: the numba
    kernels give exactly what the matrix product and np.bincount give (tests/oracles/race_numpy.py)."""
    rng = np.random.default_rng(n)
    X = rng.normal(size=(n, 7)) * rng.uniform(0.1, 10, size=7)
    hashes = RaceHashes.from_seed(3, params, 7)
    assert np.array_equal(hashes.buckets(X), buckets_numpy(hashes, X))
    labels = rng.integers(0, 3, n)
    assert np.array_equal(hashes.counts(X, labels, 3), counts_numpy(hashes, X, labels, 3))
    assert np.array_equal(sketch(hashes, X), counts_numpy(hashes, X)[0])


def test_counts_refuse_labels_the_kernel_could_not_index() -> None:
    hashes = RaceHashes.from_seed(1, RaceParams(rows=4, width=4, family="srp", p=2), 3)
    X = np.ones((3, 3))
    with pytest.raises(InvalidInput, match=r"labels must be 3 numbers in \[0, 2\), got shape \(3,\) and values 0..2"):
        hashes.counts(X, np.array([0, 1, 2]), 2)
    with pytest.raises(InvalidInput, match=r"got shape \(2,\)"):
        hashes.counts(X, np.array([0, 1]), 2)
