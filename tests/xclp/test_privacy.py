"""DP samplers (docs/design.md §6) match their distributions: seeded KS / χ² tests, plus parameter checks."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy import stats

from xclp.errors import InvalidInput
from xclp.privacy.noise import (
    discrete_laplace,
    discrete_laplace_share,
    exponential_mechanism_select,
    laplace,
    uniform_open,
)

N = 20_000
ALPHA = 1e-3  # a correct sampler fails a test with this probability for an unlucky seed


def two_sided_geometric_pmf(k: np.ndarray, scale: float) -> np.ndarray:
    q = math.exp(-1.0 / scale)
    return (1 - q) / (1 + q) * q ** np.abs(k)


def chi2_vs_two_sided_geometric(samples: np.ndarray, scale: float, *, tail: int) -> float:
    """χ² p-value of integer samples vs the pmf on [−tail, tail], both tails lumped into end cells."""
    ks = np.arange(-tail, tail + 1)
    probs = two_sided_geometric_pmf(ks, scale)
    beyond = (1 - probs.sum()) / 2
    probs[0] += beyond
    probs[-1] += beyond
    observed = np.bincount(np.clip(samples, -tail, tail) + tail, minlength=ks.size)
    return float(stats.chisquare(observed, probs * samples.size).pvalue)


# --- uniforms ------------------------------------------------------------------------------------


def test_uniforms_lie_strictly_inside_the_unit_interval_on_the_53_bit_grid() -> None:
    for source in (None, np.random.default_rng(0)):
        u = uniform_open((100, 50), source=source)
        assert u.shape == (100, 50) and u.dtype == np.float64
        assert u.min() > 0 and u.max() < 1
        k = u * 2.0**53 - 0.5
        np.testing.assert_array_equal(k, np.round(k))
    assert stats.kstest(uniform_open(N, source=np.random.default_rng(1)).ravel(), "uniform").pvalue > ALPHA


def test_default_source_never_touches_numpy_global_state() -> None:
    np.random.seed(12345)
    before = np.random.get_state()[1].copy()
    laplace(1.0, 10)
    discrete_laplace(1.0, 10)
    discrete_laplace_share(1.0, 3, 10)
    exponential_mechanism_select(np.arange(5.0), 1.0, 2)
    np.testing.assert_array_equal(np.random.get_state()[1], before)


def test_default_source_is_not_repeatable() -> None:
    assert not np.array_equal(laplace(1.0, 64), laplace(1.0, 64))


def test_seeded_source_is_repeatable() -> None:
    a = discrete_laplace_share(3.0, 4, 50, source=np.random.default_rng(9))
    b = discrete_laplace_share(3.0, 4, 50, source=np.random.default_rng(9))
    np.testing.assert_array_equal(a, b)


# --- Laplace -------------------------------------------------------------------------------------


def test_laplace_matches_distribution_ks() -> None:
    x = laplace(2.5, (N,), source=np.random.default_rng(11))
    assert x.dtype == np.float64 and x.shape == (N,)
    assert stats.kstest(x, stats.laplace(scale=2.5).cdf).pvalue > ALPHA
    # The same test has the power to reject a wrong scale.
    assert stats.kstest(x, stats.laplace(scale=2.8).cdf).pvalue < 1e-6


def test_laplace_from_os_csprng_matches_distribution() -> None:
    # Unseeded: a correct sampler fails this with probability 1e-9.
    assert stats.kstest(laplace(1.0, N), stats.laplace().cdf).pvalue > 1e-9


# --- discrete Laplace ----------------------------------------------------------------------------


@pytest.mark.parametrize("scale", [0.7, 2.0, 6.0])
def test_discrete_laplace_matches_pmf_chi2(scale: float) -> None:
    x = discrete_laplace(scale, (N,), source=np.random.default_rng(int(scale * 10)))
    assert x.dtype == np.int64
    assert chi2_vs_two_sided_geometric(x, scale, tail=int(5 * scale) + 3) > ALPHA
    assert chi2_vs_two_sided_geometric(x, scale * 1.1, tail=int(5 * scale) + 3) < 1e-6


def test_discrete_laplace_keeps_shape() -> None:
    assert discrete_laplace(1.0, (3, 4, 5), source=np.random.default_rng(0)).shape == (3, 4, 5)


# --- distributed shares (docs/design.md §6) --------------------------------------------------------------


@pytest.mark.parametrize(("n_parties", "scale"), [(1, 2.0), (2, 2.0), (3, 2.0), (5, 4.0)])
def test_any_tau_minus_one_shares_sum_to_two_sided_geometric_chi2(n_parties: int, scale: float) -> None:
    """docs/design.md §6: a party that subtracts its own share from the release still sees ε-DP noise."""
    rng = np.random.default_rng(100 + n_parties)
    others = max(n_parties - 1, 1)
    total = sum(discrete_laplace_share(scale, n_parties, (N,), source=rng) for _ in range(others))
    assert isinstance(total, np.ndarray) and total.dtype == np.int64
    assert chi2_vs_two_sided_geometric(total, scale, tail=int(5 * scale) + 3) > ALPHA


def test_a_colluding_party_subtracting_its_share_is_left_with_the_full_noise() -> None:
    """Attack (RACE distributed DP): with shares sized for all τ, a party that subtracted its own
    share saw (τ−1)/τ of the noise (effective ε = 12.5 for ε = 1, τ = 3). The τ − 1 others' shares
    must carry the whole two-sided geometric, and all τ shares τ/(τ−1) of its variance."""
    scale, tau = 3.0, 3
    q = math.exp(-1 / scale)
    base_var = 2 * q / (1 - q) ** 2
    rng = np.random.default_rng(31)
    shares = [discrete_laplace_share(scale, tau, (N,), source=rng) for _ in range(tau)]
    seen_by_party_0 = sum(shares[1:])  # the release minus party 0's own share
    assert seen_by_party_0.var() == pytest.approx(base_var, rel=0.08)
    assert sum(shares).var() == pytest.approx(base_var * tau / (tau - 1), rel=0.08)


def test_one_share_alone_is_not_the_full_noise() -> None:
    # A single share of τ = 4 has a third of the variance: Var = 2·r·q/p² with r = 1/(τ − 1).
    scale, tau = 3.0, 4
    share = discrete_laplace_share(scale, tau, (N,), source=np.random.default_rng(5))
    q = math.exp(-1 / scale)
    p = 1 - q
    expected_var = 2 * (1 / (tau - 1)) * q / p**2
    assert share.var() == pytest.approx(expected_var, rel=0.08)
    assert chi2_vs_two_sided_geometric(share, scale, tail=18) < 1e-6


def test_share_matches_negative_binomial_difference_pmf() -> None:
    # P(D = k) for D = NB(r, p) − NB(r, p), computed by convolution of scipy's pmf.
    scale, tau = 2.0, 3
    p = 1 - math.exp(-1 / scale)
    support = np.arange(0, 200)
    nb = stats.nbinom.pmf(support, 1 / (tau - 1), p)
    diff = np.convolve(nb, nb[::-1])  # index i ↔ k = i − 199
    ks = np.arange(-8, 9)
    probs = diff[ks + 199].copy()
    probs[0] += diff[: -8 + 199].sum()
    probs[-1] += diff[8 + 199 + 1 :].sum()
    x = discrete_laplace_share(scale, tau, (N,), source=np.random.default_rng(21))
    observed = np.bincount(np.clip(x, -8, 8) + 8, minlength=17)
    assert stats.chisquare(observed, probs / probs.sum() * N).pvalue > ALPHA


# --- exponential mechanism -----------------------------------------------------------------------


def softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max())
    return e / e.sum()


def test_exponential_mechanism_single_pick_frequencies_match_softmax() -> None:
    scores = np.array([0.0, 1.0, 2.0, 3.0, 3.0])
    eps = 0.7
    rng = np.random.default_rng(31)
    picks = np.array([exponential_mechanism_select(scores, eps, 1, source=rng)[0] for _ in range(8000)])
    observed = np.bincount(picks, minlength=scores.size)
    expected = softmax(eps * scores) * picks.size
    assert stats.chisquare(observed, expected).pvalue > ALPHA
    # Same test rejects a mechanism with twice the epsilon.
    assert stats.chisquare(observed, softmax(2 * eps * scores) * picks.size).pvalue < 1e-6


def test_exponential_mechanism_sequential_pairs_match_plackett_luce() -> None:
    scores = np.array([0.0, 1.0, 2.0, 4.0])
    eps = 0.5
    w = softmax(eps * scores)
    pairs = list(itertools.permutations(range(scores.size), 2))
    # Without replacement: P(i then j) = w_i · w_j / (1 − w_i).
    probs = np.array([w[i] * w[j] / (1 - w[i]) for i, j in pairs])
    rng = np.random.default_rng(41)
    draws = [tuple(exponential_mechanism_select(scores, eps, 2, source=rng)) for _ in range(8000)]
    index = {pair: n for n, pair in enumerate(pairs)}
    observed = np.bincount([index[d] for d in draws], minlength=len(pairs))
    assert stats.chisquare(observed, probs * len(draws)).pvalue > ALPHA


def test_exponential_mechanism_picks_distinct_indices_and_is_stable_for_huge_scores() -> None:
    rng = np.random.default_rng(0)
    perm = exponential_mechanism_select(np.arange(10.0), 0.3, 10, source=rng)
    assert perm.dtype == np.int64 and sorted(perm.tolist()) == list(range(10))
    # exp(1e5) overflows; the Gumbel trick does not.
    huge = np.array([0.0, 1e5, 5e4])
    assert exponential_mechanism_select(huge, 1.0, 2, source=rng).tolist() == [1, 2]
    assert exponential_mechanism_select(huge, 1.0, 0, source=rng).shape == (0,)


# --- validation ----------------------------------------------------------------------------------


@pytest.mark.parametrize("scale", [0.0, -1.0, math.inf, math.nan, "1", True, 2.0**60])
def test_bad_scale_refused(scale: object) -> None:
    for sampler in (laplace, discrete_laplace):
        with pytest.raises(InvalidInput, match="scale"):
            sampler(scale, 3)  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match="scale"):
        discrete_laplace_share(scale, 2, 3)  # type: ignore[arg-type]


@pytest.mark.parametrize("n_parties", [0, -2, 1.5, True])
def test_bad_party_count_refused(n_parties: object) -> None:
    with pytest.raises(InvalidInput, match="n_parties"):
        discrete_laplace_share(1.0, n_parties, 3)  # type: ignore[arg-type]


def test_bad_shape_and_source_refused() -> None:
    with pytest.raises(InvalidInput, match="shape"):
        laplace(1.0, (3, -1))
    with pytest.raises(InvalidInput, match="Generator"):
        laplace(1.0, 3, source=42)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("scores", "eps", "count", "message"),
    [
        (np.arange(3.0), 1.0, 4, "count must be an integer in \\[0, 3\\]"),
        (np.arange(3.0), 1.0, -1, "count"),
        (np.arange(3.0), -0.1, 1, "epsilon_per_unit"),
        (np.arange(3.0), math.nan, 1, "epsilon_per_unit"),
        (np.array([0.0, math.nan]), 1.0, 1, "NaN"),
        (np.zeros((2, 2)), 1.0, 1, "1-D"),
        (np.zeros(0), 1.0, 0, "non-empty"),
        (np.array([1e300, 0.0]), 1e300, 1, "overflows"),
    ],
)
def test_bad_exponential_mechanism_arguments_refused(scores: np.ndarray, eps: float, count: int, message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        exponential_mechanism_select(scores, eps, count)
