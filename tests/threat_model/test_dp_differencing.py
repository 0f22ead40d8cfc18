"""Differencing DBCL's sums across rounds (docs/design.md §2 point 7): what DP buys where the
parties cannot check the model.

The attack: a coordinator releases a degenerate network (every weight 0, a bias that differs by
10⁻⁶ each round so that no two released views are alike and a party's one-sum-per-model rule does
not fire), opens round 0's sum among a, b and c and round 1's among a and b only (c "missed the
deadline"). With zero weights a party's gradient is its batch's label histogram in the output
bias (n·softmax(b) − counts) and nothing else; a and b give the same gradient both rounds (their
batch is all their labeled rows), so sum₀ − sum₁ is c's gradient, and c's label counts follow.
Parties cannot see W (DBCL), so no check of theirs stops it: only noise on the contributions does.
So a party on its default policy refuses DBCL without record-level DP before it joins;
the attack below runs on parties that opted in (--allow-non-dp-dbcl).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from tests.harness import PARTIES, allow_list, coordinator, job, run_parties
from tests.helpers import blobs
from xclp.client.policy import PartyPolicy
from xclp.client.run_config import JobResult
from xclp.data.validation import UNLABELED
from xclp.errors import PolicyRefused
from xclp.nn import Network
from xclp.server.jobs.dbcl import DbclTrainer
from xclp.v1.dbcl import DbclJobParams

C, LABELED = 3, 8
BASE = {"n_classes": C, "hidden": [128], "rounds": 2, "batch_size": LABELED, "learning_rate": 0.05}
OPTED_IN = PartyPolicy(min_parties=2, allow_non_dp_dbcl=True)


def attack(keys, monkeypatch, raw: dict) -> tuple[np.ndarray, np.ndarray, DbclJobParams, int]:
    """(what the coordinator recovers as c's gradient, c's true label counts, the params, its size)."""
    opened: list[np.ndarray] = []
    real_round = DbclTrainer.round

    def round_(self, scope, t, **kw):
        assert self.net is not None
        flat = np.zeros(self.net.arch.n_params)
        flat[-C:] = 1e-6 * (t + 1)  # the output bias: a new view every round
        self.net = Network(self.net.arch, flat)
        members = yield from real_round(self, scope, t, **kw)
        return tuple(p for p in members if p != "c") if t == 1 else members

    def keep(self, total):
        opened.append(total.copy())
        return 0

    monkeypatch.setattr(DbclTrainer, "round", round_)
    monkeypatch.setattr(DbclTrainer, "apply", keep)
    datas = {p: blobs(60 + i, labeled=LABELED) for i, p in enumerate(PARTIES)}
    with coordinator(allow_list(keys), [job("diff", "dbcl", raw)]) as (_, address):
        results = run_parties(address, "diff", keys, datas, policy=OPTED_IN)
    assert all(isinstance(r, JobResult) for r in results.values()), results
    assert len(opened) == 2
    params = DbclJobParams.parse(raw)
    size = params.update_size(datas["a"].X.shape[1])
    recovered = params.decode_sum(opened[0], size)[0] - params.decode_sum(opened[1], size)[0]
    y = datas["c"].y
    counts = np.bincount(y[y != UNLABELED], minlength=C)
    return recovered, counts, params, size


def test_without_dp_the_coordinator_reads_a_partys_label_counts(keys, monkeypatch) -> None:
    recovered, counts, _, _ = attack(keys, monkeypatch, BASE)
    p = np.exp(1e-6 * np.ones(C)) / np.exp(1e-6 * np.ones(C)).sum()
    np.testing.assert_allclose(LABELED * p - recovered[-C:], counts, atol=1e-5)  # exactly c's counts
    np.testing.assert_allclose(recovered[:-C], 0.0, atol=1e-6)


def test_a_party_on_its_default_policy_refuses_dbcl_without_dp_before_joining(keys, monkeypatch) -> None:
    """The attack above, against parties on their default policy: each refuses the job before Join,
    with the reason and the way out, and the coordinator gets no update to difference."""
    seen: list[int] = []
    monkeypatch.setattr(DbclTrainer, "apply", lambda self, total: seen.append(1) or 0)
    datas = {p: blobs(60 + i, labeled=LABELED) for i, p in enumerate(PARTIES)}
    with coordinator(allow_list(keys), [job("diff", "dbcl", BASE, join_seconds=3)]) as (coord, address):
        results = run_parties(address, "diff", keys, datas, policy=PartyPolicy(min_parties=2))
        joined = coord.jobs["diff"].active
    for p in PARTIES:
        assert isinstance(results[p], PolicyRefused), results[p]
        assert "without record-level DP" in str(results[p]) and "--allow-non-dp-dbcl" in str(results[p])
    assert seen == [] and not joined


def test_with_dp_the_difference_is_drowned_in_the_noise(keys, monkeypatch) -> None:
    """The same attack on a job with dp_epsilon = 1: the difference is c's gradient plus round 0's
    noise (3 shares, 3μ/2) and round 1's (2 shares, 2μ), per cell. Every cell but the output bias
    holds no signal, so their spread measures the noise: it is what the plan says (704 cells: the
    sample deviation is within 25 % with probability 1 − 10⁻¹⁰), and its standard deviation is over
    5 times the largest label count's signal."""
    raw = {**BASE, "dp_epsilon": 1.0, "dp_delta": 1e-6, "clip_norm": 1.0}
    recovered, counts, params, size = attack(keys, monkeypatch, raw)
    dp = params.dp_plan(size)
    assert dp is not None
    expected_std = math.sqrt(dp.variance * (3 / 2 + 2)) / dp.scale
    noise = recovered[:-C]
    assert noise.std() == pytest.approx(expected_std, rel=0.25)
    signal = np.abs(LABELED / C - counts).max()  # the largest cell of c's true gradient
    assert expected_std > 5 * max(signal, 1.0)
    error = np.abs((LABELED / C - recovered[-C:]) - counts)
    assert error.max() > 1.0  # the counts do not come out
