"""FlyNN: FlyHash structure, WTA tie-breaking, additive counts (Theorem 4), inference, DP release."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from xclp.errors import InvalidInput
from xclp.flynn import FlyHash, FlyNNModel, FlyNNParams, privatise_counts, train_counts

PARAMS = FlyNNParams(dim=12, m=600, s=4, rho=16)


def blobs(n: int, seed: int, n_classes: int = 3, dim: int = 12) -> tuple[np.ndarray, np.ndarray]:
    """Well-separated, non-negative class clusters (FlyHash suits non-negative features)."""
    rng = np.random.default_rng(seed)
    centres = rng.uniform(0.0, 4.0, (n_classes, dim))
    y = rng.integers(0, n_classes, n)
    return centres[y] + rng.normal(0.0, 0.3, (n, dim)), y


def reference_active(M: np.ndarray, X: np.ndarray, rho: int) -> np.ndarray:
    """Top-ρ of M·x with ties to the smaller index, by sorting (the definition, not the kernel)."""
    proj = X @ M.T.astype(np.float64)
    out = []
    for row in proj:
        order = np.lexsort((np.arange(row.size), -row))  # by value desc, then index asc
        out.append(np.sort(order[:rho]))
    return np.array(out, dtype=np.int64)


# --- FlyHash ---------------------------------------------------------------------------------


def test_flyhash_rows_have_exactly_s_distinct_ones() -> None:
    fh = FlyHash.from_seed(7, PARAMS)
    M = fh.matrix()
    assert M.shape == (PARAMS.m, PARAMS.dim)
    assert np.all(M.sum(axis=1) == PARAMS.s)
    assert set(np.unique(M)) == {0, 1}
    assert np.all(np.diff(fh.indices, axis=1) > 0)  # distinct and ascending


def test_flyhash_columns_are_uniform() -> None:
    # Floyd sampling must pick every column equally often: chi-square over m·s picks.
    params = FlyNNParams(dim=20, m=5000, s=5, rho=10)
    counts = np.bincount(FlyHash.from_seed(3, params).indices.ravel(), minlength=20)
    assert stats.chisquare(counts).pvalue > 1e-3


def test_flyhash_is_a_function_of_the_seed() -> None:
    a, b, c = (FlyHash.from_seed(s, PARAMS) for s in (5, 5, 6))
    assert np.array_equal(a.indices, b.indices)
    assert not np.array_equal(a.indices, c.indices)


def test_flyhash_sets_exactly_rho_bits() -> None:
    X, _ = blobs(50, 0)
    bits = FlyHash.from_seed(1, PARAMS).hash(X)
    assert bits.dtype == bool and bits.shape == (50, PARAMS.m)
    assert np.all(bits.sum(axis=1) == PARAMS.rho)


def test_wta_ties_go_to_the_smallest_bit_index() -> None:
    # A zero row makes every projection 0: the ρ winners must be bits 0..ρ-1.
    fh = FlyHash.from_seed(1, PARAMS)
    active = fh.active_bits(np.zeros((2, PARAMS.dim)))
    assert np.array_equal(active, np.tile(np.arange(PARAMS.rho), (2, 1)))


@settings(max_examples=40, deadline=None)
@given(
    dim=st.integers(1, 8),
    m=st.integers(1, 40),
    seed=st.integers(0, 2**32),
    data=st.data(),
)
def test_active_bits_equal_sorting_reference(dim: int, m: int, seed: int, data: st.DataObject) -> None:
    # Small integer features make M·x exact and full of ties: the kernel must match the definition.
    s = data.draw(st.integers(1, dim))
    rho = data.draw(st.integers(1, m))
    params = FlyNNParams(dim=dim, m=m, s=s, rho=rho)
    rows = st.lists(st.lists(st.integers(-3, 3), min_size=dim, max_size=dim), min_size=1, max_size=5)
    X = np.array(data.draw(rows), dtype=float)
    fh = FlyHash.from_seed(seed, params)
    assert np.array_equal(fh.active_bits(X), reference_active(fh.matrix(), X, rho))


# --- counts and the model --------------------------------------------------------------------


def test_counts_follow_their_definition() -> None:
    X, y = blobs(60, 1)
    fh = FlyHash.from_seed(2, PARAMS)
    counts = train_counts(fh, X, y, 3)
    bits = fh.hash(X)
    assert counts.dtype == np.uint32 and counts.shape == (3, PARAMS.m)
    for label in range(3):
        assert np.array_equal(counts[label], bits[y == label].sum(axis=0))


def test_counts_of_a_three_way_split_sum_to_pooled_counts_and_predict_identically() -> None:
    # FlyNN Theorem 4 / docs/design.md §6 parity: federated aggregate == pooled computation, bit for bit.
    X, y = blobs(90, 2)
    Xq, _ = blobs(40, 3)
    fh = FlyHash.from_seed(9, PARAMS)
    pooled = train_counts(fh, X, y, 3)
    parts = [train_counts(fh, X[idx], y[idx], 3) for idx in np.array_split(np.random.default_rng(0).permutation(90), 3)]
    federated = sum(p.astype(np.uint64) for p in parts)
    assert np.array_equal(federated, pooled)
    for gamma in (0.0, 0.5):
        a = FlyNNModel(pooled, gamma, fh).predict(Xq, tie_seed=4)
        b = FlyNNModel(federated, gamma, fh).predict(Xq, tie_seed=4)
        assert np.array_equal(a, b)


def test_filters_are_gamma_to_the_counts() -> None:
    fh = FlyHash.from_seed(1, FlyNNParams(dim=3, m=4, s=2, rho=2))
    counts = np.array([[0, 1, 2, 0], [3, 0, 0, 1]])
    assert np.array_equal(FlyNNModel(counts, 0.0, fh).filters(), [[1, 0, 0, 1], [0, 1, 1, 0]])
    np.testing.assert_allclose(FlyNNModel(counts, 0.5, fh).filters(), 0.5**counts)


def test_predict_recovers_well_separated_classes() -> None:
    X, y = blobs(300, 4)
    fh = FlyHash.from_seed(5, PARAMS)
    model = FlyNNModel.train(fh, X[:200], y[:200], 3)
    assert np.mean(model.predict(X[200:], tie_seed=0) == y[200:]) >= 0.95


def test_scores_are_filter_weights_on_active_bits() -> None:
    X, y = blobs(40, 5)
    fh = FlyHash.from_seed(6, PARAMS)
    model = FlyNNModel.train(fh, X, y, 3)
    expected = fh.hash(X[:7]).astype(float) @ model.filters().T
    np.testing.assert_array_equal(model.scores(X[:7]), expected)


def test_exact_ties_are_broken_by_a_seeded_uniform_draw() -> None:
    fh = FlyHash.from_seed(1, PARAMS)
    model = FlyNNModel(np.zeros((3, PARAMS.m)), 0.0, fh)  # every class scores ρ: all tie
    X, _ = blobs(600, 6)
    a = model.predict(X, tie_seed=11)
    assert np.array_equal(a, model.predict(X, tie_seed=11))
    assert not np.array_equal(a, model.predict(X, tie_seed=12))
    assert stats.chisquare(np.bincount(a, minlength=3)).pvalue > 1e-3


def test_model_accepts_released_float_counts() -> None:
    fh = FlyHash.from_seed(1, PARAMS)
    counts = np.zeros((2, PARAMS.m))
    counts[0, :5] = [0.3, 2.7, 0.0, 1.5, 9.2]
    model = FlyNNModel(counts, 0.0, fh)
    assert model.counts.dtype == np.float64
    assert model.predict(np.ones((3, PARAMS.dim)), tie_seed=0).shape == (3,)


# --- bad input -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(dim=4, m=10, s=5, rho=2), "s .* exceeds the data dimension"),
        (dict(dim=4, m=10, s=2, rho=11), "rho .* exceeds the hash dimension"),
        (dict(dim=4, m=10, s=2, rho=2, gamma=1.0), r"gamma .* must be in \[0, 1\)"),
        (dict(dim=4, m=10, s=2, rho=2, gamma=-0.1), r"gamma .* must be in \[0, 1\)"),
        (dict(dim=0, m=10, s=2, rho=2), "dim must be a positive integer"),
        (dict(dim=4, m=2.5, s=2, rho=2), "m must be a positive integer"),
        (dict(dim=4, m=10, s=True, rho=2), "s must be a positive integer"),
    ],
)
def test_invalid_params_are_refused(kwargs: dict, message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        FlyNNParams(**kwargs)


@pytest.mark.parametrize(
    ("X", "y", "message"),
    [
        (np.full((3, 12), np.nan), [0, 1, 2], "NaN/inf"),
        (np.array([[np.inf] * 12]), [0], "NaN/inf"),
        (np.ones((3, 11)), [0, 1, 2], "11 columns but 12 were expected"),
        (np.ones((0, 12)), [], "no rows"),
        (np.ones((3, 12)), [0, 1, 3], "label 3 at row 2 is out of range"),
        (np.ones((3, 12)), [0, -1, 1], "label -1 at row 1 is out of range"),
        (np.ones((3, 12)), [0, 1], "got 2 labels for 3 rows"),
    ],
)
def test_bad_training_data_is_refused(X: np.ndarray, y: list, message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        train_counts(FlyHash.from_seed(1, PARAMS), X, np.array(y, dtype=np.int64), 3)


def test_bad_query_data_is_refused() -> None:
    model = FlyNNModel(np.zeros((2, PARAMS.m)), 0.0, FlyHash.from_seed(1, PARAMS))
    with pytest.raises(InvalidInput, match="NaN/inf"):
        model.predict(np.full((1, PARAMS.dim), np.nan), tie_seed=0)
    with pytest.raises(InvalidInput, match="columns but 12 were expected"):
        model.predict(np.ones((1, 5)), tie_seed=0)


@pytest.mark.parametrize(
    ("counts", "message"),
    [
        (-np.ones((2, PARAMS.m)), "non-negative"),
        (np.full((2, PARAMS.m), np.nan), "NaN/inf"),
        (np.zeros((2, PARAMS.m - 1)), f"columns but the FlyHash has m = {PARAMS.m}"),
        (np.zeros((1, PARAMS.m)), "n_classes >= 2"),
    ],
)
def test_bad_model_counts_are_refused(counts: np.ndarray, message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        FlyNNModel(counts, 0.0, FlyHash.from_seed(1, PARAMS))


def test_bad_flyhash_indices_are_refused() -> None:
    params = FlyNNParams(dim=4, m=2, s=2, rho=1)
    with pytest.raises(InvalidInput, match="distinct columns"):
        FlyHash(params, np.array([[1, 1], [0, 2]]))
    with pytest.raises(InvalidInput, match=r"lie in \[0, 4\)"):
        FlyHash(params, np.array([[1, 4], [0, 2]]))


# --- differential privacy (Ram & Sinha 2022 Alg. 2, docs/design.md §6) ---------------------------------------


def test_release_keeps_at_most_T_non_negative_entries() -> None:
    X, y = blobs(80, 7)
    counts = train_counts(FlyHash.from_seed(1, PARAMS), X, y, 3)
    released = privatise_counts(counts, 1.0, 20, 2, source=np.random.default_rng(0))
    assert released.shape == counts.shape and released.dtype == np.float64
    assert np.count_nonzero(released) <= 20 and np.all(released >= 0)
    discrete = privatise_counts(counts, 1.0, 20, 2, source=np.random.default_rng(0), discrete=True)
    assert discrete.dtype == np.int64 and np.count_nonzero(discrete) <= 20 and np.all(discrete >= 0)


def test_release_noise_is_laplace_2T_tau_over_epsilon() -> None:
    # T entries so large that the exponential mechanism certainly picks them and no clipping
    # occurs: the released minus true values are then exactly the Laplace noise.
    T, tau, eps = 5, 2, 1.0
    counts = np.zeros((2, 50))
    counts[0, :T] = 10_000
    rng = np.random.default_rng(1)
    noise = np.concatenate([privatise_counts(counts, eps, T, tau, source=rng)[0, :T] - 10_000 for _ in range(400)])
    scale = 2 * T * tau / eps
    assert stats.kstest(noise, stats.laplace(scale=scale).cdf).pvalue > 1e-3
    assert stats.kstest(noise, stats.laplace(scale=scale / 2).cdf).pvalue < 1e-6  # half the noise is detected


@pytest.mark.parametrize("n_parties", [1, 2])
def test_selection_probability_is_exp_eps_c_over_4T_tau(n_parties: int) -> None:
    # Two candidate entries differing by a = 4 (both far from 0, so the picked one stays non-zero):
    # the paper's mechanism picks the larger with probability e^{εa/(4Tτ)} / (1 + e^{εa/(4Tτ)}).
    counts = np.array([[1000.0], [1004.0]])
    rng = np.random.default_rng(2)
    trials = 2000
    picked_larger = sum(privatise_counts(counts, 1.0, 1, n_parties, source=rng)[1, 0] > 0 for _ in range(trials))
    z = 4.0 / (4.0 * n_parties)
    assert stats.binomtest(picked_larger, trials, np.exp(z) / (1 + np.exp(z))).pvalue > 1e-3
    z_authors = 4.0 / (2.0 * n_parties)
    assert stats.binomtest(picked_larger, trials, np.exp(z_authors) / (1 + np.exp(z_authors))).pvalue < 1e-6


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((0.0, 5, 2), "epsilon .* must be finite and > 0"),
        ((float("inf"), 5, 2), "epsilon .* must be finite and > 0"),
        ((1.0, 0, 2), "T .* must be a positive integer"),
        ((1.0, 101, 2), "T = 101 exceeds the 100 count entries"),
        ((1.0, 5, 0), "n_parties must be a positive integer"),
    ],
)
def test_bad_privacy_arguments_are_refused(args: tuple, message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        privatise_counts(np.zeros((2, 50)), *args)


def test_release_needs_exact_integer_counts() -> None:
    with pytest.raises(InvalidInput, match="exact integer counts"):
        privatise_counts(np.full((2, 5), 0.5), 1.0, 2, 1)
