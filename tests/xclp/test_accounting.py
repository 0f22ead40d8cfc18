"""Distributed Skellam noise and the privacy it buys over rounds (xclp.privacy.noise
`skellam_share`, xclp.privacy.accounting): any τ − 1 shares are the whole noise, and the accountant's ε is
the Skellam mechanism's Rényi DP composed and converted by dp-accounting."""

from __future__ import annotations

import numpy as np
import pytest

from tests.helpers import chi2_vs_skellam
from xclp.errors import InvalidInput
from xclp.privacy.accounting import ORDERS, skellam_epsilon, skellam_rdp
from xclp.privacy.noise import skellam_share

N = 20_000
ALPHA = 1e-3  # a correct sampler fails with this probability for an unlucky seed


@pytest.mark.parametrize(("tau", "variance"), [(1, 9.0), (2, 9.0), (3, 16.0), (5, 25.0)])
def test_any_tau_minus_one_shares_sum_to_the_required_skellam(tau: int, variance: float) -> None:
    rng = np.random.default_rng(200 + tau)
    total = sum(skellam_share(variance, tau, (N,), source=rng) for _ in range(max(tau - 1, 1)))
    assert isinstance(total, np.ndarray) and total.dtype == np.int64
    assert chi2_vs_skellam(total, variance) > ALPHA


def test_shares_sized_for_all_tau_fail_the_same_test() -> None:
    """What the construction guards against: with shares sized so that all τ make the noise, the
    τ − 1 a colluding party leaves are (τ − 1)/τ of it, and the test tells."""
    variance, tau = 16.0, 3
    rng = np.random.default_rng(7)
    sized_for_tau = [skellam_share(variance * (tau - 1) / tau, tau, (N,), source=rng) for _ in range(tau - 1)]
    assert chi2_vs_skellam(sum(sized_for_tau), variance) < 1e-6


def test_a_party_subtracting_its_own_share_still_sees_the_whole_noise() -> None:
    variance, tau = 25.0, 4
    rng = np.random.default_rng(11)
    shares = [skellam_share(variance, tau, (N,), source=rng) for _ in range(tau)]
    assert sum(shares[1:]).var() == pytest.approx(variance, rel=0.05)
    assert sum(shares).var() == pytest.approx(variance * tau / (tau - 1), rel=0.05)


def test_the_rdp_is_the_theorems_closed_form() -> None:
    # α = 2, Δ₂ = 1, Δ₁ = 1, μ = 4: 2/8 + min((3 + 6)/64, 3/8) = 0.25 + 0.140625
    assert skellam_rdp(2, 1.0, 1.0, 4.0) == pytest.approx(0.390625, rel=1e-12)
    # small μ: the other branch of the min, 3Δ₁/(2μ)
    assert skellam_rdp(10, 1.0, 1.0, 0.5) == pytest.approx(10 / 1.0 + 3 / 1.0, rel=1e-12)


def test_composed_epsilon_approaches_the_gaussian_accountants_for_large_variance() -> None:
    """With μ ≫ Δ the Skellam bound is the Gaussian mechanism's; 100 releases of Δ₂ = 10 at μ = 10⁴
    (noise multiplier 10) must give the ε of dp-accounting's own Gaussian RDP accountant, and never
    less."""
    import dp_accounting
    from dp_accounting.rdp import RdpAccountant

    releases = [(10.0, 100.0, 1e4)] * 100
    epsilon, _ = skellam_epsilon(releases, 1e-5)
    gaussian = RdpAccountant(list(ORDERS))
    gaussian.compose(dp_accounting.GaussianDpEvent(noise_multiplier=10.0), 100)
    expected = gaussian.get_epsilon(1e-5)
    assert expected <= epsilon <= expected * 1.02


def test_more_rounds_spend_more_and_bad_inputs_are_refused() -> None:
    one, _ = skellam_epsilon([(1.0, 1.0, 100.0)], 1e-6)
    ten, _ = skellam_epsilon([(1.0, 1.0, 100.0)] * 10, 1e-6)
    assert 0 < one < ten and skellam_epsilon([], 1e-6)[0] == 0.0
    for args, message in [((1, 1.0, 1.0, 1.0), "integer orders alpha >= 2"), ((2, 1.0, 0.5, 1.0), "impossible"),
                          ((2, 0.0, 1.0, 1.0), "l2 must be finite and > 0"), ((2, 1.0, 1.0, float("nan")), "variance")]:
        with pytest.raises(InvalidInput, match=message):
            skellam_rdp(*args)
    with pytest.raises(InvalidInput, match="delta must be in"):
        skellam_epsilon([(1.0, 1.0, 1.0)], 0.0)
