"""Label-DP for XCLP's row sums (xclp.privacy.label_dp): randomised response and block-calibrated Skellam noise."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from xclp.client.policy import PartyPolicy
from xclp.client.steps import xclp as steps
from xclp.crypto.fixedpoint import FixedPoint
from xclp.errors import ConfigError, InvalidInput, PolicyRefused
from xclp.privacy import label_dp
from xclp.v1 import xclp_pb2 as pb
from xclp.v1.allreduce import FlynnJobParams, RaceJobParams
from xclp.v1.xclp import XclpJobParams, label_dp_line


def response_counts(label: int, n_classes: int, epsilon: float, n: int, hide: bool) -> np.ndarray:
    out = label_dp.randomised_response(np.full(n, label), n_classes, epsilon, hide_unlabeled=hide)
    return np.bincount(out + 1, minlength=n_classes + 1)  # [unlabeled, class 0, ...]


@pytest.mark.parametrize("hide", [False, True])
def test_randomised_response_keeps_a_label_with_the_promised_probability_and_spreads_the_rest_evenly(hide) -> None:
    """χ² against keep p = e^ε/(e^ε + K − 1), the K − 1 others at (1 − p)/(K − 1) each; the counts
    of a mechanism for another ε (1.15 ε) fail the same test."""
    n_classes, epsilon, n = 4, 1.0, 200_000
    values = n_classes + hide
    p = label_dp.keep_probability(epsilon, values)
    assert p == pytest.approx(math.exp(epsilon) / (math.exp(epsilon) + values - 1))

    def expected(eps: float, label: int) -> np.ndarray:
        keep = label_dp.keep_probability(eps, values)
        e = np.full(n_classes + 1, (1 - keep) / (values - 1))
        if not hide:
            e[0] = 0.0  # a labeled row never comes out unlabeled
        e[label + 1] = keep
        return e * n

    for label in (2, -1) if hide else (2,):
        counts = response_counts(label, n_classes, epsilon, n, hide)
        cells = expected(epsilon, label) > 0
        assert stats.chisquare(counts[cells], expected(epsilon, label)[cells]).pvalue > 1e-4
        assert stats.chisquare(counts[cells], expected(1.15 * epsilon, label)[cells]).pvalue < 1e-6


def test_unlabeled_rows_stay_unlabeled_when_the_coordinator_knows_them() -> None:
    y = np.array([-1, 0, 1, -1, 2] * 1000)
    out = label_dp.randomised_response(y, 3, 0.1, hide_unlabeled=False)
    assert np.all(out[y == -1] == -1) and np.all(out[y != -1] >= 0)


def block(seed: int, n: int = 40, labeled: int = 12) -> np.ndarray:
    rng = np.random.default_rng(seed)
    S = rng.uniform(0, 1, size=(n, labeled)) ** 4
    S[rng.integers(0, n), 3] = 9.0  # one column much larger than the rest: it sets the noise
    return S


GRAPH = (("a", 10), ("b", 15), ("c", 15))


def test_skellam_sensitivity_bounds_a_changed_label_and_is_tight_for_the_largest_column() -> None:
    """Relabel each of a's rows a → b: the rounded release moves by at most the plan's Δ₂ and Δ₁, and
    by close to Δ₂ for the column the plan is calibrated to (a bound without the √2 fails this)."""
    S, own = block(1), slice(0, 10)
    y = np.arange(12) % 3
    plan = label_dp.plan(2.0, 1e-6, *label_dp.largest_columns(S, own), rows=30, frac_bits=32)
    released = np.r_[10:40]

    def exact(labels: np.ndarray) -> np.ndarray:
        return np.rint(steps.local_scores(S, labels, 3, normalise_labels=False)[released] * plan.scale)

    moves = []
    for i in range(12):
        other = y.copy()
        other[i] = (y[i] + 1) % 3
        d = exact(other) - exact(y)
        assert np.linalg.norm(d) <= plan.l2 and np.abs(d).sum() <= plan.l1
        moves.append(np.linalg.norm(d))
    assert max(moves) >= 0.95 * plan.l2


def test_skellam_release_has_the_planned_noise_on_others_rows_none_on_its_own_and_a_restart_resends_it() -> None:
    fp = FixedPoint(frac_bits=32)
    S = block(2)
    Zbar = steps.local_scores(S, np.arange(12) % 3, 3, normalise_labels=False)
    own = slice(0, 10)
    plan = label_dp.plan(1.0, 1e-6, *label_dp.largest_columns(S, own), rows=30, frac_bits=32)
    noise = []
    for _ in range(60):
        release = steps.label_dp_release(Zbar, GRAPH, "a", plan, fp)
        decoded = fp.decode(release.encoded)
        np.testing.assert_allclose(decoded[own], Zbar[own], atol=2**-32)
        noise.append((decoded[10:] - Zbar[10:]) * plan.scale)
    noise = np.concatenate(noise).ravel()
    assert noise.var() == pytest.approx(plan.variance, rel=0.05)  # 5 400 cells: ±2 % sampling error
    frame = steps.encode_row_sums(release, GRAPH, ("a", "c"))
    np.testing.assert_array_equal(frame, np.concatenate([release.encoded[:10], release.encoded[25:]]))


def test_skellam_noise_follows_the_block_received() -> None:
    """A block whose columns are 4× larger gets 4× the noise (what a crafted block costs the crafter)."""
    S, own = block(3), slice(0, 10)
    small = label_dp.plan(1.0, 1e-6, *label_dp.largest_columns(S, own), rows=30, frac_bits=32)
    large = label_dp.plan(1.0, 1e-6, *label_dp.largest_columns(4 * S, own), rows=30, frac_bits=32)
    assert large.noise_std / small.noise_std == pytest.approx(4.0, rel=0.02)
    none = label_dp.plan(1.0, 1e-6, *label_dp.largest_columns(np.zeros((40, 12)), own), rows=30, frac_bits=32)
    assert none.variance == 0 and "no noise is needed" in none.describe()


def test_skellam_release_refuses_values_the_ring_cannot_hold() -> None:
    S, own = block(4), slice(0, 10)
    plan = label_dp.plan(0.01, 1e-6, *label_dp.largest_columns(S, own), rows=30, frac_bits=48)
    with pytest.raises(InvalidInput, match="lower frac_bits or raise label_dp_epsilon"):
        steps.label_dp_release(np.full((40, 3), 1e3), GRAPH, "a", plan, FixedPoint(frac_bits=48, headroom_terms=3))


def test_job_parameters_of_label_dp() -> None:
    base = {"n_classes": 3}
    params = XclpJobParams.parse({**base, "label_dp_epsilon": 2})
    assert params.label_dp and params.label_dp_mechanism == "response" and params.label_epsilon_total == 2
    assert params.epsilon_total is None  # the rows' features still shape H: no record-level DP
    assert "each label randomised before use" in label_dp_line(params)
    skellam = XclpJobParams.parse({**base, "label_dp_epsilon": 2, "label_dp_mechanism": "skellam",
                                   "label_dp_delta": 1e-6})
    assert "δ = 1e-06, Skellam noise" in label_dp_line(skellam)
    for bad, message in [({"label_dp_epsilon": 2, "label_dp_delta": 1e-6}, "is ε-DP with δ = 0"),
                         ({"label_dp_epsilon": 2, "label_dp_mechanism": "skellam"}, "needs label_dp_delta"),
                         ({"label_dp_delta": 1e-6}, "label-DP is off"),
                         ({"label_dp_epsilon": 0}, "must be finite and > 0"),
                         ({"label_dp_epsilon": 2, "label_dp_mechanism": "laplace"}, "must be one of response"),
                         ({"label_dp_epsilon": 2, "label_dp_mechanism": "skellam", "label_dp_delta": 0.5},
                          r"must be in \(0, 0.01\]"),
                         ({"label_dp_epsilon": 2, "label_dp_mechanism": "skellam", "label_dp_delta": 1e-6,
                           "label_norm": "party"}, 'needs label_norm = "none"')]:
        with pytest.raises(ConfigError, match=message):
            XclpJobParams.parse({**base, **bad})


def spec(job_type: str) -> pb.JobSpec:
    return pb.JobSpec(job_id="j", job_type=job_type, expected_parties=["a", "b", "c"])


def test_require_label_dp_refuses_labels_released_without_it_or_with_a_larger_epsilon() -> None:
    policy = PartyPolicy(require_label_dp=4.0)
    xclp = {"n_classes": 3, "key_bits": 2048}
    with pytest.raises(PolicyRefused, match="releases what its labels say without DP"):
        policy.check_job(spec("xclp"), XclpJobParams.parse(xclp))
    with pytest.raises(PolicyRefused, match=r"spends epsilon = 8 on each label; .* <= 4 \(--require-label-dp\)"):
        policy.check_job(spec("xclp"), XclpJobParams.parse({**xclp, "label_dp_epsilon": 8}))
    policy.check_job(spec("xclp"), XclpJobParams.parse({**xclp, "label_dp_epsilon": 4}))
    flynn = {"n_classes": 3, "m": 64, "s": 3, "rho": 8}
    with pytest.raises(PolicyRefused, match="without DP"):
        policy.check_job(spec("flynn"), FlynnJobParams.parse(flynn))
    # record-level DP covers labels
    policy.check_job(spec("flynn"), FlynnJobParams.parse({**flynn, "epsilon": 2.0, "T": 4}))
    policy.check_job(spec("race"), RaceJobParams.parse({"rows": 8, "width": 64}))  # reads no labels
    with pytest.raises(PolicyRefused, match="protects labels only, not the rows: see --require-label-dp"):
        PartyPolicy(require_dp=4.0).check_job(spec("xclp"), XclpJobParams.parse({**xclp, "label_dp_epsilon": 1}))
    with pytest.raises(PolicyRefused, match="--require-label-dp must be a positive epsilon"):
        PartyPolicy(require_label_dp=0.0)
    assert PartyPolicy.from_settings({"require_label_dp": 2.5}).require_label_dp == 2.5
