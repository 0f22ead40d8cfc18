"""DP moments (xclp.privacy.dp_moments): the sensitivity of the clipped integer sums, the plan
the accountant gives, the release's shares, the post-processing every side applies, and the job
parameters and policy around them."""

from __future__ import annotations

import math

import numpy as np
import pytest

from xclp.client.policy import PartyPolicy
from xclp.errors import ConfigError, InvalidInput, PolicyRefused
from xclp.privacy import dp_moments
from xclp.privacy.accounting import skellam_epsilon
from xclp.privacy.dpsgd import RoundNoise
from xclp.v1 import xclp_pb2 as pb
from xclp.v1.registry import parse_params

FLYNN = {"n_classes": 3, "m": 64, "s": 2, "rho": 8}
DP_MOMENTS = {"standardise": True, "moments_epsilon": 1.0, "moments_delta": 1e-6, "moments_bounds": [-3.0, 3.0]}


def test_replacing_one_row_moves_every_cell_by_at_most_the_scale_and_a_row_from_lo_to_hi_by_exactly_that():
    rng = np.random.default_rng(0)
    d, g = 6, 8
    bounds = dp_moments.bounds_array([(-3.0, 3.0)], d)
    X = rng.normal(size=(40, d)) * 2.5
    X[rng.random(X.shape) < 0.1] = np.nan
    base = dp_moments.local_sums(X, bounds, g)
    worst = 0
    for _ in range(300):
        other = X.copy()
        row = rng.normal(size=d) * rng.choice([1.0, 100.0])  # far outside the bounds too
        row[rng.random(d) < 0.2] = np.nan
        other[rng.integers(40)] = row
        worst = max(worst, int(np.abs(dp_moments.local_sums(other, bounds, g) - base).max()))
    assert worst <= 2**g
    low, high = X.copy(), X.copy()
    low[0], high[0] = -3.0, 3.0
    moved = dp_moments.local_sums(high, bounds, g) - dp_moments.local_sums(low, bounds, g)
    assert (moved[1:] == 2**g).all() and (moved[0] == 0).all()  # Σu and Σu² by the whole scale; counts stay


def test_the_plan_spends_its_epsilon_and_noisy_counts_cost_half_as_much_variance_again():
    exact = dp_moments.plan(1.0, 1e-6, 10, noisy_counts=False)
    noisy = dp_moments.plan(1.0, 1e-6, 10, noisy_counts=True)
    for p, cells in ((exact, 20), (noisy, 30)):
        assert p.cells == cells and p.l2 == pytest.approx(2**p.scale_bits * math.sqrt(cells))
        spent = skellam_epsilon([(p.l2, p.l1, p.variance)], p.delta)[0]
        assert 0.999 < spent <= 1.0
    assert noisy.variance / exact.variance == pytest.approx(1.5, rel=0.02)  # μ ∝ Δ₂² in the Gaussian regime
    tiny = dp_moments.plan(0.2, 1e-6, 2000, noisy_counts=True)  # too much for 2^16: a coarser grid
    assert tiny.scale_bits < dp_moments.SCALE_BITS and tiny.variance * 2 <= 2.0**50
    with pytest.raises(InvalidInput, match="raise moments_epsilon"):
        dp_moments.plan(1e-4, 1e-12, 4000, noisy_counts=True)


def test_any_two_of_three_shares_make_the_planned_noise_and_exact_counts_stay_exact():
    d = 400
    plan = dp_moments.plan(1.0, 1e-6, d, noisy_counts=False)
    rng = np.random.default_rng(1)
    sums = dp_moments.local_sums(rng.normal(size=(30, d)), dp_moments.bounds_array([(-3, 3)], d), plan.scale_bits)
    shares = []
    for _ in range(3):
        noise = np.zeros(sums.shape, dtype=np.int64)
        noise[plan.noise_mask()] = RoundNoise(plan, plan.cells).for_members(3)
        released = dp_moments.release(sums, noise, plan, 128)
        back = np.vectorize(lambda v: v >> (128 - plan.scale_bits), otypes=[object])(released).astype(np.int64)
        np.testing.assert_array_equal(back, sums + noise)  # shifted exactly: nothing lost on the way up
        assert (back[0] == sums[0]).all()  # the row count is public without impute: no noise on it
        shares.append(noise[1:].ravel())
    assert all((a != b).any() for a, b in zip(shares, shares[1:]))  # three independent draws
    # The variance on 800 cells has a 5 % standard error: too loose to tell the right share size from
    # a wrong one without failing now and then. The same shares drawn over 100 000 cells: 0.45 %.
    cells = 100_000
    two = sum(RoundNoise(plan, cells).for_members(3).astype(np.float64) for _ in range(2))
    assert two.var() == pytest.approx(plan.variance, rel=0.03)  # what the coordinator sees with c subtracting its own
    one = RoundNoise(plan, cells).for_members(2).astype(np.float64)
    assert one.var() == pytest.approx(plan.variance, rel=0.03)  # a sum of two: one share is the whole noise
    assert RoundNoise(plan, cells).for_members(4).astype(np.float64).var() * 2 != pytest.approx(plan.variance, rel=0.1)
    with pytest.raises(InvalidInput, match="noise on the exact counts"):
        dp_moments.release(sums, np.ones(sums.shape, dtype=np.int64), plan, 128)


def test_the_scaling_is_the_clipped_tables_and_post_processing_keeps_it_in_range():
    rng = np.random.default_rng(2)
    d, F = 4, 128
    plan = dp_moments.plan(1.0, 1e-6, d, noisy_counts=True)
    bounds = dp_moments.bounds_array([(0.0, 10.0), (0.0, 10.0), (-1.0, 1.0), (5.0, 6.0)], d)
    X = np.column_stack([rng.uniform(0, 12, 500), np.full(500, 4.0), rng.normal(size=500), rng.uniform(0, 4.9, 500)])
    exact = dp_moments.release(dp_moments.local_sums(X, bounds, plan.scale_bits), np.zeros((3, d), np.int64),
                               plan, F)
    scaling = dp_moments.scaling(exact, F, plan, bounds, standardise=True, impute=True)
    clipped = np.clip(X, bounds[:, 0], bounds[:, 1])
    np.testing.assert_allclose(scaling.mean, clipped.mean(axis=0), atol=1e-4)
    assert scaling.std[0] == pytest.approx(clipped[:, 0].std(), rel=1e-3)
    assert scaling.std[2] == pytest.approx(clipped[:, 2].std(), rel=1e-3)
    floor = math.sqrt(plan.std / 500)  # the constant column: scaled by the noise level, never dropped
    assert scaling.kept.all() and scaling.std[1] == pytest.approx(10 * floor)
    assert scaling.std[3] == pytest.approx(1 * floor)  # all clipped to lo: variance 0, lifted to the floor
    # noise beyond the range: a mean clamped into the bounds, a variance at most 1/4 of the width²
    wild = exact.copy()
    wild[1, 0] = 600 << F
    wild[2, 2] = -(50 << F)
    wild[0, 3] = 0
    out = dp_moments.scaling(wild, F, plan, bounds, standardise=True, impute=True)
    assert out.mean[0] == 10.0 and out.std[0] <= 5.0
    assert out.kept.tolist() == [True, True, True, False]  # a noisy count below one row: empty everywhere


@pytest.mark.parametrize(("raw", "message"), [
    ({**FLYNN, "moments_epsilon": 1.0, "moments_delta": 1e-6, "moments_bounds": [0, 1]}, "neither standardises"),
    ({**FLYNN, "standardise": True, "moments_epsilon": 1.0}, "needs moments_delta"),
    ({**FLYNN, "standardise": True, "moments_bounds": [0, 1]}, "which is not set"),
    ({**FLYNN, **DP_MOMENTS, "moments_delta": 0.5}, r"moments_delta must be in \(0, 0.01\]"),
    ({**FLYNN, **DP_MOMENTS, "moments_epsilon": -1.0}, "moments_epsilon must be > 0"),
    ({**FLYNN, **DP_MOMENTS, "moments_bounds": [3, -3]}, "lo < hi"),
    ({**FLYNN, **DP_MOMENTS, "moments_bounds": "wide"}, r"must be \[lo, hi\] or a list"),
    ({**FLYNN, **DP_MOMENTS, "moments_bounds": [[0, 1], [0, True]]}, r"must be \[lo, hi\] or a list"),
])
def test_job_parameters_of_dp_moments_are_refused_with_what_is_wrong(raw, message):
    with pytest.raises(ConfigError, match=message):
        parse_params("flynn", raw)


def test_the_bounds_must_name_one_range_or_one_per_feature_column():
    params = parse_params("flynn", {**FLYNN, **DP_MOMENTS, "moments_bounds": [[0, 1], [0, 2], [0, 3]]})
    params.check_table(3)
    assert params.moments_ranges(3)[:, 1].tolist() == [1.0, 2.0, 3.0]
    with pytest.raises(InvalidInput, match="3 \\[lo, hi\\] ranges for 5 feature columns"):
        params.check_table(5)
    parse_params("flynn", {**FLYNN, **DP_MOMENTS}).check_table(5)


def test_require_dp_takes_a_standardising_job_by_its_releases_and_moments_epsilon_together():
    spec = pb.JobSpec(job_id="f", job_type="flynn", expected_parties=["a", "b", "c"])
    private = {**FLYNN, "epsilon": 2.0, "T": 5}
    with pytest.raises(PolicyRefused, match="standardises or imputes without DP.*moments_epsilon"):
        PartyPolicy(require_dp=8.0).check_job(spec, parse_params("flynn", {**private, "standardise": True}))
    params = parse_params("flynn", {**private, **DP_MOMENTS})
    assert params.epsilon_total == 3.0 and params.label_epsilon_total == 2.0  # the moments read no labels
    PartyPolicy(require_dp=3.0).check_job(spec, params)
    with pytest.raises(PolicyRefused, match=r"epsilon = 3 in total .*\(2 for its releases and 1 for the moments\)"):
        PartyPolicy(require_dp=2.5).check_job(spec, params)
    xclp = parse_params("xclp", {"n_classes": 3, **DP_MOMENTS})
    with pytest.raises(PolicyRefused, match="releases without DP"):  # DP moments do not make XCLP's H private
        PartyPolicy(require_dp=8.0).check_job(pb.JobSpec(job_id="x", job_type="xclp",
                                                         expected_parties=["a", "b", "c"]), xclp)


def test_the_simulated_moments_phase_gives_the_pooled_scaling_exactly_or_within_the_planned_noise():
    from xclp.simulation import pooled_scaling

    rng = np.random.default_rng(3)
    tables = [rng.normal(size=(2000, 3)) * [1.0, 10.0, 100.0] + [0.0, 5.0, -50.0] for _ in range(3)]
    X = np.vstack(tables)
    exact = pooled_scaling(tables, parse_params("flynn", {**FLYNN, "standardise": True}))
    np.testing.assert_allclose(exact.mean, X.mean(axis=0), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(exact.std, X.std(axis=0), rtol=1e-12)
    ranges = [[-5.0, 5.0], [-45.0, 55.0], [-550.0, 450.0]]  # 5 σ either side: clipping moves little
    params = parse_params("flynn", {**FLYNN, **DP_MOMENTS, "moments_bounds": ranges})
    plan = params.moments_plan(3)
    assert plan is not None
    noisy = pooled_scaling(tables, params)
    width = np.diff(np.array(ranges), axis=1).ravel()
    sigma = plan.std * math.sqrt(1.5) / X.shape[0] * width  # three shares of μ/2 on the sum of u
    assert (np.abs(noisy.mean - X.mean(axis=0)) < 6 * sigma).all()
    assert not np.array_equal(noisy.mean, exact.mean)
    # the variance in range units carries B̃/ñ's noise (and a little of the mean's): 0.0027 against 0.01 here
    error = np.abs((noisy.std / width) ** 2 - (X.std(axis=0) / width) ** 2)
    assert (error < 8 * plan.std * math.sqrt(1.5) / X.shape[0]).all()
