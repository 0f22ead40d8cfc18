"""Releases accounted against the data, across runs and job definitions (client/ledger.py).

The release log this replaces was keyed on the whole job definition: a coordinator that changed
the job id, the expected parties, one unrelated parameter or the job type got the same moments
released again among one party fewer, and the difference was that party's exact count, mean and
variance per feature. A DP job rerun many times averaged its noise away; XCLP's randomised
responses, drawn afresh each run, gave most labels to a majority vote. Each test drives the real
party code through the real coordinator, and each attack was seen to work on the code before the
ledger.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from tests.harness import Recorder, allow_list, coordinator, job, on_threads, party_data, run_parties
from xclp.client import responses
from xclp.client.ledger import Budget, Ledger, Release, Spend, data_digest, function_id
from xclp.client.policy import PartyPolicy
from xclp.client.run_config import JobResult
from xclp.crypto.paillier import PaillierKeypair
from xclp.errors import ConfigError, PolicyRefused
from xclp.privacy import dp_moments, label_dp
from xclp.privacy.accounting import composed_epsilon, pure_rdp
from xclp.server.admin_cli import format_run

PARTIES4 = ("a", "b", "c", "d")
FLYNN = {"n_classes": 3, "m": 64, "s": 3, "rho": 8, "standardise": True}
RACE = {"n_classes": 3, "rows": 4, "width": 16, "standardise": True}


def run_once(keys, tmp_path, parties, *, job_id="std", job_type="flynn", params=FLYNN, expected=PARTIES4,
             allow_rerun=False, join_seconds=30.0, budget: Budget | None = None, min_parties=3, datas=None):
    """One run with `parties` joining, each with its ledger in tmp_path/<party>."""
    datas = datas or {p: party_data(100 + i) for i, p in enumerate(PARTIES4)}
    ledgers = {p: {"ledger": Ledger(tmp_path / p, allow_rerun=allow_rerun, identity=keys[p],
                                    **({"budget": budget} if budget else {}))} for p in parties}
    rec = Recorder()
    config = job(job_id, job_type, params, parties=expected, min_parties=min_parties, join_seconds=join_seconds)
    with coordinator(allow_list(keys), [config], observer=rec) as (_, address):
        results = run_parties(address, job_id, keys, {p: datas[p] for p in parties},
                              policy=PartyPolicy(min_parties=min_parties, insecure_test_keys=True), overrides=ledgers)
    return results, rec


VARIANTS = {  # the second run's definition: each escaped the old log, which was keyed on all of it
    "job-id": dict(job_id="std-2"),
    "expected-parties": dict(expected=("a", "b", "c")),
    "unrelated-parameter": dict(params={**FLYNN, "m": 65}),
    "job-type": dict(job_type="race", params=RACE),
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_the_moments_released_among_four_are_not_released_again_among_three_under_another_definition(
        keys, tmp_path, variant: str) -> None:
    """Attack: run 1 standardises among a, b, c, d; run 2, under another job definition, among a, b,
    c. The two pooled moments difference to d's exact count, sum and sum of squares per feature.
    The parties' ledgers name the moments of each column, not the job: run 2 is refused before
    anything is masked."""
    first, _ = run_once(keys, tmp_path, PARTIES4)
    assert all(isinstance(r, JobResult) for r in first.values()), first
    second, rec = run_once(keys, tmp_path, ("a", "b", "c"), join_seconds=1.0, **VARIANTS[variant])
    for p in "abc":
        assert isinstance(second[p], PolicyRefused), (p, second[p])
        assert ("this party released this data set exactly among a, b, c, d (job 'std', run 1: the count of "
                "column '#1'") in str(second[p])
    assert not [k for k in rec.seen if k[1] in ("moments", "sum")]  # nothing masked, so nothing to open


def test_the_same_set_may_run_again_and_allow_rerun_lifts_the_refusal(keys, tmp_path) -> None:
    run_once(keys, tmp_path, PARTIES4)
    again, _ = run_once(keys, tmp_path, PARTIES4, job_id="std-again")
    assert all(isinstance(r, JobResult) for r in again.values()), again
    fewer, _ = run_once(keys, tmp_path, ("a", "b", "c"), allow_rerun=True, join_seconds=1.0)
    assert all(isinstance(r, JobResult) for r in fewer.values()), fewer


DP_RACE = {"n_classes": 3, "rows": 4, "width": 16, "epsilon": 0.05, "standardise": True, "moments_epsilon": 0.05,
           "moments_delta": 1e-8, "moments_bounds": [-5.0, 10.0]}


def test_reruns_of_a_dp_job_stop_at_the_data_sets_budget(keys, tmp_path) -> None:
    """Attack: a DP job (DP moments and DP RACE, ε = 0.1 in all, which every --require-dp 2 party
    takes) rerun again and again: the noise of K runs averages down as 1/√K (256 + 256 runs gave
    d's feature means back to 0.31). Each party's ledger charges every run against its data set
    and composes the runs by RDP: the budget below holds 20 runs (basic composition, ε adding up,
    would have refused run 11), and run 21 is refused before Join, with the numbers."""
    datas = {p: party_data(200 + i) for i, p in enumerate("abc")}
    run = [dp_moments.plan(0.05, 1e-8, 8, noisy_counts=False).rdp, pure_rdp(0.05)]  # the DP moments, DP RACE
    twenty, twenty_one = composed_epsilon(run * 20, 1e-5), composed_epsilon(run * 21, 1e-5)
    assert twenty < 1.0 < 20 * 0.1  # RDP holds twenty runs in less than basic composition's ten
    budget = Budget((twenty + twenty_one) / 2, 1e-5)
    for k in range(20):
        results, _ = run_once(keys, tmp_path, "abc", job_id=f"dp-{k}", job_type="race", params=DP_RACE,
                              expected=("a", "b", "c"), budget=budget, min_parties=2, datas=datas)
        assert all(isinstance(r, JobResult) for r in results.values()), (k, results)
    ledger = Ledger(tmp_path / "a", budget=budget)
    standing = ledger.standing(data_digest(datas["a"]))
    assert standing["composition"] == "rdp" and standing["spent"]["epsilon"] == pytest.approx(twenty, rel=1e-9)
    refused, rec = run_once(keys, tmp_path, "abc", job_id="dp-20", job_type="race", params=DP_RACE,
                            expected=("a", "b", "c"), budget=budget, min_parties=2, datas=datas, join_seconds=1.0)
    for p in "abc":
        assert isinstance(refused[p], PolicyRefused), (p, refused[p])
        assert (f"would spend ε = 0.1, δ = 1e-08 of this data set's privacy budget; it has spent ε = {twenty:g}, "
                f"δ = 1e-05 of ε = {budget.epsilon:g}") in str(refused[p])
        assert f"with this job it would have spent ε = {twenty_one:g} (RDP composition)" in str(refused[p])
    assert not rec.seen  # refused before Join: nothing of the run reached the coordinator


XCLP = {"n_classes": 3, "k": 4, "lsh_bits": 64, "key_bits": 512, "insecure_test_keys": True, "label_dp_epsilon": 1.0}


def test_label_dp_reruns_reuse_the_same_randomised_responses_and_spend_nothing_new(keys, tmp_path,
                                                                                  monkeypatch) -> None:
    """Attack: XCLP with randomised response at ε = 1 rerun 41 times; a majority vote over the runs
    gave the coordinator (with one colluding party) 97 % of d's labels, since each run drew fresh
    responses. They are now drawn once per data set and ε, kept sealed in the ledger, and every
    rerun releases the very same responses and spends nothing new."""
    drawn: list[np.ndarray] = []
    real = label_dp.randomised_response

    def counted(*args, **kwargs):
        drawn.append(real(*args, **kwargs))
        return drawn[-1]

    monkeypatch.setattr(label_dp, "randomised_response", counted)
    paillier = {p: PaillierKeypair.generate(512, allow_insecure_test_size=True) for p in "abc"}
    datas = {p: party_data(300 + i, unlabeled=20) for i, p in enumerate("abc")}
    for run in range(3):
        ledgers = {p: {"ledger": Ledger(tmp_path / p, identity=keys[p])} for p in "abc"}
        with coordinator(allow_list(keys), [job(f"x{run}", "xclp", XCLP)]) as (_, address):
            results = run_parties(address, f"x{run}", keys, datas, paillier=paillier, overrides=ledgers,
                                  policy=PartyPolicy(min_parties=2, insecure_test_keys=True))
        assert all(isinstance(r, JobResult) for r in results.values()), results
    assert len(drawn) == 3  # once per party, over three runs
    for p in "abc":
        ledger = Ledger(tmp_path / p, identity=keys[p])
        assert ledger.spent(data_digest(datas[p])) == (1.0, 0.0)  # one charge, not three
        again = responses.released_labels(ledger, data_digest(datas[p]), datas[p].ids, ("0", "1", "2"), 1.0, False,
                                          lambda: np.zeros(1, np.int64))
        assert any(np.array_equal(again, d) for d in drawn)
        sealed = next((tmp_path / p / "responses").iterdir()).read_bytes()
        assert again.tobytes() not in sealed  # sealed at rest


def test_the_ledger_survives_a_crash_mid_write_and_refuses_a_corrupted_file(keys, tmp_path, monkeypatch) -> None:
    ledger = Ledger(tmp_path, identity=keys["a"])
    data = b"\x01" * 32
    moments = Release(function_id("moments", "age", "sum"), "the sum of column 'age'")
    ledger.reserve_exact(data, [moments], "abc", "j", "1")
    before = (tmp_path / "ledger.json").read_bytes()
    assert (tmp_path / "ledger.json").stat().st_mode & 0o777 == 0o600

    def crash(src, dst):
        raise OSError("the machine lost power")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="lost power"):
        ledger.reserve_exact(data, [Release(function_id("moments", "age", "count"), "x")], "abc", "j", "2")
    monkeypatch.undo()
    assert (tmp_path / "ledger.json").read_bytes() == before  # the old ledger, whole
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".ledger.json.") and p.suffix != ".lock"] == []
    with pytest.raises(PolicyRefused, match="released this data set exactly among a, b, c .*: the sum of column 'age'"):
        ledger.reserve_exact(data, [moments], "abd", "j", "3")
    (tmp_path / "ledger.json").write_text('{"version": 1, "datasets": ')
    with pytest.raises(ConfigError, match="cannot be read .* it is not reset silently"):
        ledger.reserve_exact(data, [moments], "abc", "j", "3")
    assert (tmp_path / "ledger.json").read_text() == '{"version": 1, "datasets": '  # left as it was
    (tmp_path / "ledger.json").write_text(json.dumps({"version": 7, "datasets": {}}))
    with pytest.raises(ConfigError, match="is not a version 2 ledger"):
        ledger.spent(data)


def test_the_ledger_holds_no_feature_label_or_value(keys, tmp_path) -> None:
    """After a standardising run and a label-DP run: the ledger names columns, parties, jobs and
    guarantees; no feature value, label or row id of the table is in it."""
    datas = {p: party_data(100 + i) for i, p in enumerate(PARTIES4)}
    run_once(keys, tmp_path, PARTIES4, datas=datas)
    text = (tmp_path / "a" / "ledger.json").read_text()
    data = datas["a"]
    assert "#1" in text and "std" in text
    for value in data.X.ravel()[:50]:
        assert f"{value:.6g}" not in text and repr(float(value)) not in text
    for row_id in data.ids:
        assert row_id not in text
    assert '"label' not in text


FEDAVG = {"n_classes": 3, "hidden": [4], "rounds": 2, "local_epochs": 1, "batch_size": 64, "seed": 3}


def test_a_fedavg_update_from_the_same_initial_model_is_not_released_again_among_others(keys, tmp_path) -> None:
    """Attack: FedAvg among a, b, c, d, then "another" job (new id, one more round) among a, b, c
    with the same `seed`, so the same θ₀: round 0's two sums, full-batch, difference to d's update.
    The update from θ₀ under the same training settings is one function of the data: refused."""
    first, _ = run_once(keys, tmp_path, PARTIES4, job_id="fa", job_type="fedavg", params=FEDAVG)
    assert all(isinstance(r, JobResult) for r in first.values()), first
    second, rec = run_once(keys, tmp_path, ("a", "b", "c"), job_id="fb", job_type="fedavg",
                           params={**FEDAVG, "rounds": 3}, join_seconds=1.0)
    for p in "abc":
        assert isinstance(second[p], PolicyRefused), (p, second[p])
        assert "released this data set exactly among a, b, c, d (job 'fa', run 1: training updates" in str(second[p])
    assert not [k for k in rec.seen if k[1] == "r0.update"]


@pytest.mark.parametrize("min_parties", [3, 4])
def test_a_party_whose_budget_is_spent_declines_and_the_operator_hears_that_not_what(keys, tmp_path,
                                                                                    min_parties: int) -> None:
    """d's data set has spent its budget; a, b, c have not. d declines the run in a signed call
    (Decline), so the operator's `job show` says why d is missing (a fixed reason: nothing of what
    d released), and the run does not wait out its join deadline for it: it starts with a, b, c, or,
    when min_parties = 4, fails at once saying so. Before Decline, d was "never joined" and the
    run waited the whole deadline."""
    datas = {p: party_data(300 + i) for i, p in enumerate(PARTIES4)}
    budget = Budget(0.15, 1e-5)
    Ledger(tmp_path / "d", budget=budget).charge(data_digest(datas["d"]), [Spend(0.1, 0.0, "run:x:release", "x")],
                                                "earlier", "1")
    ledgers = {p: {"ledger": Ledger(tmp_path / p, budget=budget, identity=keys[p])} for p in PARTIES4}
    config = job("dp", "race", DP_RACE, parties=PARTIES4, min_parties=min_parties, join_seconds=60.0)
    with coordinator(allow_list(keys), [config]) as (coord, address):
        results = run_parties(address, "dp", keys, datas, overrides=ledgers,
                              policy=PartyPolicy(min_parties=3, insecure_test_keys=True))
        info = coord.run_info(coord.store.runs(job_id="dp", limit=1)[0].run_id)
    assert isinstance(results["d"], PolicyRefused), results["d"]
    why = "declined: its privacy budget for this data set is spent"
    parties = {p.party_id: p for p in info.parties}
    assert (parties["d"].state, parties["d"].reason) == ("declined", why)
    line = next(x for x in format_run(info).splitlines() if x.strip().startswith("d "))
    assert "declined" in line and "ε" not in line and "0.1" not in line  # why, never the numbers
    if min_parties == 3:
        assert all(isinstance(results[p], JobResult) for p in "abc"), results
        assert info.state == "done" and info.started_at < info.created_at + 60  # before the join deadline
    else:
        assert info.state == "failed" and info.reason == f"d ({why}): at most 3 of the 4 required parties can join"
        for p in "abc":
            assert why in str(results[p]), results[p]


def test_a_coordinator_that_interrupts_every_run_gets_at_most_rejoins_more_and_each_is_charged(
        keys, tmp_path, monkeypatch) -> None:
    """Attack: the coordinator interrupts every run of a DP job once all three noisy arrays are
    masked (it could open them first: each run draws fresh noise, and K draws average down as
    1/√K) and opens the job's next run, for the parties to join again. Each party joins at most
    --rejoins (2 here) more runs, then stops with the interruption; its ledger charged every run
    it joined, so the budget bounds what no rejoin limit would. With the limit not applied the
    parties followed all six runs."""
    import threading

    from xclp.client.api import take_part
    from xclp.client.connection import ConnectionConfig
    from xclp.client.run_config import RunConfig
    from xclp.errors import RunInterrupted
    from xclp.server.phases.masked_sum import MaskedSum

    datas = {p: party_data(300 + i) for i, p in enumerate("abc")}
    said: dict[str, list[str]] = {p: [] for p in "abc"}
    interrupted: list[str] = []
    config = job("dp", "race", DP_RACE, parties=("a", "b", "c"), min_parties=2, join_seconds=30)
    real = MaskedSum.on_step_complete

    def cut(self, step) -> None:  # every run's sum masked by all: the run is cut, and the next one opened
        if step.name != self.name or step.wire != "sum" or len(interrupted) >= 6:
            return real(self, step)
        run = self.scope.run
        interrupted.append(run.run_id)

        def next_run() -> None:  # off the run's lock, as a stop would
            run.cancel("the coordinator is shutting down", interrupted=True)
            coord._queue_run("dp", "")
            coord._advance("dp")
        threading.Thread(target=next_run, daemon=True).start()

    monkeypatch.setattr(MaskedSum, "on_step_complete", cut)
    with coordinator(allow_list(keys), [config]) as (coord, address):
        def party(p: str):
            run_config = RunConfig("dp", p, keys[p], ConnectionConfig(address, insecure=True), join_wait_seconds=10,
                                   idle_seconds=60, peers=allow_list(keys), workers=0,
                                   policy=PartyPolicy(min_parties=2, require_dp=1.0),
                                   ledger=Ledger(tmp_path / p, identity=keys[p]))
            return take_part(run_config, lambda params: datas[p], progress=said[p].append, rejoins=2)

        results = on_threads("abc", party, 120)
    assert len(interrupted) == 3, interrupted  # the first run and two rejoined; nobody joined a fourth
    run = [dp_moments.plan(0.05, 1e-8, 8, noisy_counts=False).rdp, pure_rdp(0.05)]  # the DP moments, DP RACE
    for p in "abc":
        assert isinstance(results[p], RunInterrupted), (p, results[p])
        assert sum("joined job dp" in line for line in said[p]) == 3
        assert [line for line in said[p] if "joining the job's next run" in line][-1].endswith(
            "(2 of at most 2 times; the coordinator has 10 s to answer, --connect-timeout)")
        spent, _ = Ledger(tmp_path / p).spent(data_digest(datas[p]))
        assert spent == pytest.approx(composed_epsilon(run * 3, 1e-5), rel=1e-9)
