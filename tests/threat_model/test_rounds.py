"""Attacks on training rounds (DESIGN §2.6-2.7): who is sampled, and two sums over one model.

Each is the real coordinator with the transitions an attacker changes replaced, against real
parties: the coordinator choosing a round's parties, and releasing the same θ twice with
different sets, so that the difference of the two opened sums is one party's update.
"""

from __future__ import annotations

import pytest

from tests.harness import PARTIES, Recorder, allow_list, coordinator, job, party_data, run_parties
from xclp.client.policy import PartyPolicy
from xclp.errors import ProtocolError
from xclp.server.jobs.fedavg import FedavgTrainer
from xclp.server.jobs.training import Samples
from xclp.server.phases.base import Step
from xclp.v1 import fedavg
from xclp.v1.registry import parse_params

FEDAVG = {"n_classes": 3, "hidden": [4], "rounds": 2, "local_epochs": 1, "batch_size": 8}


def test_the_rounds_samples_come_from_the_parties_common_seed_not_the_job_file() -> None:
    """The job file's `seed` used to draw every round's sample: a coordinator could pick a seed
    whose samples isolate the party it wants. Now they follow the common seed, which the
    coordinator never sees, and the job's seed has no say."""
    roster = ("a", "b", "c", "d", "e")
    one = fedavg.samples_payload(bytes(32), 6, roster, 0.6)
    assert fedavg.samples_payload(bytes(32), 6, roster, 0.6).tolist() == one.tolist()  # all parties agree
    assert fedavg.samples_payload(b"\x01" * 32, 6, roster, 0.6).tolist() != one.tolist()
    assert (one.sum(axis=1) == 3).all()
    for seed in (0, 1, 2):  # the job file's seed changes θ₀ only
        assert parse_params("fedavg", {**FEDAVG, "seed": seed}).seed == seed


def test_a_coordinator_cannot_choose_a_rounds_parties(keys, monkeypatch) -> None:
    """Attack: the coordinator takes the parties' announcements and runs each round with a set of
    its own choosing (here: the sample with one party swapped for the one left out)."""
    def choose(self: Samples, step: Step) -> None:
        announced = fedavg.samples_from_payload(next(iter(step.received.values())), self.rounds, self.roster)
        self.done(tuple(tuple(sorted((set(s) - {s[0]}) | (set(self.roster) - set(s)))) for s in announced))

    monkeypatch.setattr(Samples, "on_step_complete", choose)
    rec = Recorder()
    datas = {p: party_data(70 + i) for i, p in enumerate(PARTIES)}
    with coordinator(allow_list(keys), [job("t", "fedavg", {**FEDAVG, "fraction": 0.6})], observer=rec) as (_, addr):
        results = run_parties(addr, "t", keys, datas, policy=PartyPolicy(min_parties=2))
    refused = [p for p in PARTIES if isinstance(results[p], ProtocolError)
               and "outside the sample the parties drew for that round" in str(results[p])]
    assert refused, results  # the party the coordinator put in (and, if it gets that far, its partner)
    assert not [k for k in rec.seen if k[1].endswith(".update")]  # no update was sent


def test_a_party_opens_one_sum_per_model(keys, monkeypatch) -> None:
    """Attack (the one-view issue): round 0 among a, b, c; the coordinator keeps θ (round 1
    releases θ₀ again) and runs round 1's update among a and b only. sum₀ − sum₁ would be c's
    update. a and b opened round 0's sum on θ₀ among a, b, c, so they refuse a second one on θ₀
    among others."""
    real_round = FedavgTrainer.round

    def round_(self, scope, t):
        members = yield from real_round(self, scope, t)
        return tuple(p for p in members if p != "c") if t == 1 else members

    def keep(self, total):
        return fedavg.decode_update(total, self.params.frac_bits)[1]  # "applied": θ stays θ₀

    monkeypatch.setattr(FedavgTrainer, "round", round_)
    monkeypatch.setattr(FedavgTrainer, "apply", keep)
    rec = Recorder()
    datas = {p: party_data(80 + i) for i, p in enumerate(PARTIES)}
    with coordinator(allow_list(keys), [job("t", "fedavg", FEDAVG)], observer=rec) as (_, addr):
        results = run_parties(addr, "t", keys, datas, policy=PartyPolicy(min_parties=2))
    assert {k[3] for k in rec.seen if k[1] == "r0.update_reveal"} == set(PARTIES)  # round 0 was opened
    for p in ("a", "b"):
        assert isinstance(results[p], ProtocolError), (p, results[p])
        assert "round 1 releases the model of round 0, whose update sum this party opened among a, b, c" in str(
            results[p])
    assert not [k for k in rec.seen if k[1] == "r1.update"]  # and no second sum over θ₀


@pytest.mark.parametrize("fraction", [1.0, 0.6])
def test_honest_rounds_run_on_the_parties_samples(keys, fraction: float) -> None:
    rec = Recorder()
    datas = {p: party_data(90 + i) for i, p in enumerate(PARTIES)}
    with coordinator(allow_list(keys), [job("t", "fedavg", {**FEDAVG, "fraction": fraction})],
                     observer=rec) as (coord, addr):
        results = run_parties(addr, "t", keys, datas, policy=PartyPolicy(min_parties=2))
        history = coord.jobs["t"].job.history
    assert all(not isinstance(r, BaseException) for r in results.values()), results
    announced = {k[3] for k in rec.seen if k[1] == "samples"}
    assert announced == set(PARTIES)
    seed = next(iter(results.values())).seed
    expected = fedavg.samples_from_payload(fedavg.samples_payload(seed, 2, PARTIES, fraction), 2, PARTIES)
    assert [tuple(h["parties"]) for h in history] == list(expected)
