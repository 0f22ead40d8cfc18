"""Record-level DP of the training jobs (xclp.privacy.dpsgd): clipping that bounds what one row
moves, the integer release, the plan's noise against the accountant, each round's noise share,
and the exact Poisson sampler the Skellam noise is drawn with."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from tests.helpers import chi2_vs_skellam
from xclp.dbcl import RoundView, draw_sketches, pack
from xclp.errors import ConfigError, InvalidInput
from xclp.nn import Architecture, Network
from xclp.privacy.dpsgd import DpPlan, RoundNoise, clipped_gradient_sum, plan, randomised_round, scale_bits
from xclp.privacy.noise import poisson
from xclp.v1.registry import parse_params

ARCH = Architecture((5, 7, 3))
DP = {"dp_epsilon": 8.0, "dp_delta": 1e-6, "clip_norm": 1.0}


def batch(seed: int, n: int = 12) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, 5)) * 3, rng.integers(0, 3, n), rng.random(n) + 0.5


def models() -> list[Network | RoundView]:
    net = Network.init(ARCH, np.random.default_rng(1))
    sketches = draw_sketches(ARCH, [0, 1], "countsketch", {0: 3, 1: 4}, b"\x01" * 32)
    return [net, RoundView.release(net, sketches)]


def one_by_one(model: Network | RoundView, X, y, w, clip: float) -> np.ndarray:
    """The reference: each example's own gradient from the model's backward pass, clipped, summed."""
    total = 0.0
    for n in range(y.shape[0]):
        if isinstance(model, Network):
            _, g = model.loss_and_grad(X[n:n + 1], y[n:n + 1], w[n:n + 1])
        else:
            _, dWs, dbs = model.loss_and_grad(X[n:n + 1], y[n:n + 1], w[n:n + 1])
            g = pack(dWs, dbs)
        total = total + g * min(1.0, clip / np.linalg.norm(g))
    return np.asarray(total)


@pytest.mark.parametrize("kind", ["network", "sketched view"])
def test_the_clipped_sum_equals_clipping_each_examples_own_gradient(kind: str) -> None:
    model = models()[kind == "sketched view"]
    X, y, w = batch(3)
    v, norms = clipped_gradient_sum(model, X, y, w, 0.5)
    np.testing.assert_allclose(v, one_by_one(model, X, y, w, 0.5), rtol=1e-10, atol=1e-12)
    assert (norms > 0.5).sum() >= 3  # the clip was binding for some examples, so the test means something


@pytest.mark.parametrize("kind", ["network", "sketched view"])
def test_one_replaced_row_moves_the_sum_by_at_most_twice_the_clip(kind: str) -> None:
    """What the noise is sized for: whatever a row holds (here features scaled up 10³ times,
    another label and a weight of 10⁴), the party's contribution moves by <= 2C. Without the clip
    it moves by thousands."""
    model = models()[kind == "sketched view"]
    X, y, w = batch(4)
    X2, y2, w2 = X.copy(), y.copy(), w.copy()
    X2[5] *= 1e3
    y2[5] = (int(np.argmax(model.forward(X2[5:6])[0])) + 1) % 3  # a label the model gets wrong
    w2[5] = 1e4

    def moved(clip: float) -> float:
        return float(np.linalg.norm(clipped_gradient_sum(model, X2, y2, w2, clip)[0]
                                    - clipped_gradient_sum(model, X, y, w, clip)[0]))

    assert moved(1.0) <= 2.0 + 1e-9
    assert moved(1e12) > 1000


def test_randomised_rounding_is_unbiased_and_never_off_by_a_whole_step() -> None:
    x = np.full(200_000, 2.3)
    r = randomised_round(x)
    assert r.dtype == np.int64 and set(np.unique(r)) == {2, 3}
    assert abs(r.mean() - 2.3) < 5 * math.sqrt(0.21 / x.size)


def test_the_plan_spends_the_budget_and_no_more() -> None:
    p = plan(4.0, 1e-6, 1.0, 50, 1000, distributed=True)
    assert 0.999 * 4.0 <= p.spent(50) <= 4.0
    assert p.spent(10) < p.spent(50)  # a party in fewer rounds spends less
    assert 2 * p.clip * p.scale >= 64 * math.sqrt(1000)  # the rounding adds at most 1/64 to Δ₂
    assert p.l2 == 2 * p.scale + math.sqrt(1000)
    more = plan(4.0, 1e-6, 1.0, 200, 1000, distributed=True)
    # 4× the releases need about 4× the variance (the Gaussian regime: ε is about linear in the RDP)
    assert 3.0 < more.variance / p.variance < 4.5
    assert plan(4.0, 1e-6, 0.1, 50, 1000, distributed=True).noise_multiplier == pytest.approx(p.noise_multiplier,
                                                                                              rel=0.02)


def test_bad_plans_and_parameters_are_refused() -> None:
    with pytest.raises(InvalidInput, match="more noise than can be drawn exactly"):
        plan(1e-4, 1e-9, 1.0, 100_000, 1_000_000, distributed=False)
    with pytest.raises(InvalidInput, match="too small"):
        scale_bits(1e-12, 1000)
    p = plan(8.0, 1e-6, 1.0, 10, 100, distributed=True)
    p.check_headroom(10_000, 1, 100)
    with pytest.raises(InvalidInput, match="beyond the ring's 2\\^62"):
        p.check_headroom(2**52, 1, 100)
    base = {"n_classes": 3, "hidden": [4]}
    with pytest.raises(ConfigError, match="the ring's 2\\^62"):
        parse_params("dbcl", {**base, **DP, "batch_size": 2**50}).check_dim(6)
    for job_type in ("dbcl", "fedavg"):
        with pytest.raises(ConfigError, match="needs dp_epsilon, dp_delta and clip_norm together; got only dp_epsilon"):
            parse_params(job_type, {**base, "dp_epsilon": 1.0})
        with pytest.raises(ConfigError, match="dp_delta must be in \\(0, 0.01\\]"):
            parse_params(job_type, {**base, **DP, "dp_delta": 0.5})
        assert parse_params(job_type, {**base, **DP}).epsilon_total == 8.0
    with pytest.raises(ConfigError, match="pseudo_label = 'xclp' cannot run with dp_epsilon"):
        parse_params("fedavg", {**base, **DP, "pseudo_label": "xclp"})
    with pytest.raises(ConfigError, match="local_epochs does not apply with dp_epsilon"):
        parse_params("fedavg", {**base, **DP, "local_epochs": 2})


def small_plan(variance: float) -> DpPlan:
    return DpPlan(1.0, 1e-6, 1.0, 1, 1, True, 0, variance)


def test_a_restart_with_fewer_parties_tops_the_same_share_up() -> None:
    """Round noise of μ among m = 5: each share is μ/4. The sum restarts among 3: the same share,
    plus an independent top-up, is μ/2, so any 2 of the 3 still make μ; the first attempt's share is
    part of it (a restart adds no fresh, independent view of the party's update)."""
    mu, n = 12.0, 40_000
    noise = RoundNoise(small_plan(mu), n)
    first = noise.for_members(5).copy()
    assert noise.for_members(5) is noise.share  # the same attempt size: the same share
    second = noise.for_members(3)
    assert second.var() == pytest.approx(mu / 2, rel=0.05)
    assert (second - first).var() == pytest.approx(mu / 2 - mu / 4, rel=0.05)
    assert abs(np.corrcoef(first, second - first)[0, 1]) < 0.03
    np.testing.assert_array_equal(noise.for_members(4), second)  # never shrinks back


def test_any_m_minus_one_shares_of_a_round_are_the_whole_noise_and_not_when_sized_for_all() -> None:
    """A party subtracting its own share from the opened sum still sees Skellam(μ) (χ² against the
    pmf); shares sized so that all m make μ leave it (m − 1)/m of that, and the same test fails."""
    mu, m, n = 16.0, 3, 30_000
    others = sum(RoundNoise(small_plan(mu), n).for_members(m) for _ in range(m - 1))
    assert chi2_vs_skellam(np.asarray(others), mu) > 1e-3
    sized_for_all = sum(RoundNoise(small_plan(mu * (m - 1) / m), n).for_members(m) for _ in range(m - 1))
    assert chi2_vs_skellam(np.asarray(sized_for_all), mu) < 1e-6


@pytest.mark.parametrize("lam", [3.0, 30.0, 5000.0])
def test_the_poisson_sampler_has_the_poisson_law(lam: float) -> None:
    x = poisson(lam, 100_000, source=np.random.default_rng(int(lam)))
    hi = int(lam + 8 * math.sqrt(lam)) + 5
    lo = max(0, int(lam - 8 * math.sqrt(lam)))
    ks = np.arange(lo, hi)
    probs = stats.poisson.pmf(ks, lam)
    probs[0] += stats.poisson.cdf(lo - 1, lam)
    probs[-1] += stats.poisson.sf(hi - 1, lam)
    observed = np.bincount(np.clip(x, lo, hi - 1) - lo, minlength=ks.size)
    assert stats.chisquare(observed, probs * x.size).pvalue > 1e-3
    wrong = poisson(lam * 1.1, 100_000, source=np.random.default_rng(1))
    observed = np.bincount(np.clip(wrong, lo, hi - 1) - lo, minlength=ks.size)
    assert stats.chisquare(observed, probs * x.size).pvalue < 1e-6  # the test tells a wrong λ


def test_the_poisson_sampler_stays_exact_at_the_largest_means() -> None:
    """At λ = 2^48 the naive log-pmf cancels to ±1 and skewed the variance by 8 %; now mean and
    variance are λ within their sampling error."""
    lam, n = 2.0**48, 400_000
    x = poisson(lam, n, source=np.random.default_rng(5))
    assert abs(x.mean() - lam) < 5 * math.sqrt(lam / n)
    assert x.var() / lam == pytest.approx(1.0, abs=5 * math.sqrt(2 / n))
