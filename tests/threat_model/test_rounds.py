"""Attacks on training rounds (docs/design.md §2.6-2.7): who is sampled, and two sums over one model.

Each is the real coordinator with the transitions an attacker changes replaced, against real
parties: the coordinator choosing a round's parties, and releasing the same θ twice with
different sets, so that the difference of the two opened sums is one party's update.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.harness import PARTIES, Recorder, allow_list, coordinator, job, party_data, run_parties
from tests.threat_model.hostile import hostile
from xclp.client.policy import PartyPolicy
from xclp.errors import ProtocolError
from xclp.fedavg import client_update, local_rng, training_set
from xclp.nn import Network
from xclp.server.jobs.fedavg import FedavgTrainer
from xclp.server.jobs.training import Attest, Samples
from xclp.server.phases.base import PhaseFailed, Step
from xclp.server.run import Run
from xclp.v1 import training
from xclp.v1.registry import parse_params

FEDAVG = {"n_classes": 3, "hidden": [4], "rounds": 2, "local_epochs": 1, "batch_size": 8}


def test_the_rounds_samples_come_from_the_parties_common_seed_not_the_job_file() -> None:
    """The job file's `seed` used to draw every round's sample: a coordinator could pick a seed
    whose samples isolate the party it wants. Now they follow the common seed, which the
    coordinator never sees, and the job's seed has no say."""
    roster = ("a", "b", "c", "d", "e")
    one = training.samples_payload(bytes(32), 6, roster, 0.6)
    assert training.samples_payload(bytes(32), 6, roster, 0.6).tolist() == one.tolist()  # all parties agree
    assert training.samples_payload(b"\x01" * 32, 6, roster, 0.6).tolist() != one.tolist()
    assert (one.sum(axis=1) == 3).all()
    for seed in (0, 1, 2):  # the job file's seed changes θ₀ only
        assert parse_params("fedavg", {**FEDAVG, "seed": seed}).seed == seed


def test_a_coordinator_cannot_choose_a_rounds_parties(keys, monkeypatch) -> None:
    """Attack: the coordinator takes the parties' announcements and runs each round with a set of
    its own choosing (here: the sample with one party swapped for the one left out)."""
    def choose(self: Samples, step: Step) -> None:
        announced = training.samples_from_payload(next(iter(step.received.values())), self.rounds, self.roster)
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


@pytest.mark.parametrize("seeds", ["relayed", "withheld"])
def test_a_party_opens_one_sum_per_model(keys, monkeypatch, seeds: str) -> None:
    """Attack (the one-view issue): round 0 among a, b, c; the coordinator keeps θ (round 1
    releases θ₀ again) and runs round 1's update among a and b only. sum₀ − sum₁ would be c's
    update. If it relays round 0's seeds as a FedAvg sum must, a and b recompute θ₁ and refuse θ₀
    (docs/design.md §2.7); if it withholds them ("round 0 was not opened"), θ₀ is what they expect, but
    they opened round 0's sum on θ₀ among a, b, c and refuse a second one among others."""
    real_round, real_send = FedavgTrainer.round, Run.send

    def send(self, party_id, wire_name, attempt, payload, *, ledger_name):
        if seeds == "withheld" and wire_name.endswith("_seeds"):
            return 0
        return real_send(self, party_id, wire_name, attempt, payload, ledger_name=ledger_name)

    monkeypatch.setattr(Run, "send", send)
    if seeds == "withheld":  # nobody could attest the round: the attacker asks no one to
        monkeypatch.setattr(Attest, "start", lambda self: self.done())

    def round_(self, scope, t, **kw):
        members = yield from real_round(self, scope, t, **kw)
        return tuple(p for p in members if p != "c") if t == 1 else members

    def keep(self, total):
        return training.decode_update(total, self.params.frac_bits)[1]  # "applied": θ stays θ₀

    monkeypatch.setattr(FedavgTrainer, "round", round_)
    monkeypatch.setattr(FedavgTrainer, "apply", keep)
    rec = Recorder()
    datas = {p: party_data(80 + i) for i, p in enumerate(PARTIES)}
    with coordinator(allow_list(keys), [job("t", "fedavg", FEDAVG)], observer=rec) as (_, addr):
        results = run_parties(addr, "t", keys, datas, policy=PartyPolicy(min_parties=2))
    assert {k[3] for k in rec.seen if k[1] == "r0.update_reveal"} == set(PARTIES)  # round 0 was opened
    refusal = ("the model of round 1 is not the head of the model chain (the model round 0's opened sum led to"
               if seeds == "relayed" else
               "round 1 releases the model of round 0, whose update sum this party opened among a, b, c")
    for p in ("a", "b"):
        assert isinstance(results[p], ProtocolError), (p, results[p])
        assert refusal in str(results[p])
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
    expected = training.samples_from_payload(training.samples_payload(seed, 2, PARTIES, fraction), 2, PARTIES)
    assert [tuple(h["parties"]) for h in history] == list(expected)


def test_every_member_recomputes_theta_and_refuses_another(keys, monkeypatch) -> None:
    """Attack (docs/design.md §2.7): the coordinator opens round 0 and moves θ by another amount than the
    mean update (here twice the mean: a model of its making). Every member got every masked
    vector and, once opened, every seed; it recomputes θ₁ itself and refuses the one it is sent."""
    from xclp.fedavg import server_update

    def doubled(self, total):
        delta, rows = training.decode_update(total, self.params.frac_bits)
        self.net = server_update(self.net, 2 * delta, rows)
        return rows

    monkeypatch.setattr(FedavgTrainer, "apply", doubled)
    datas = {p: party_data(110 + i) for i, p in enumerate(PARTIES)}
    with coordinator(allow_list(keys), [job("t", "fedavg", FEDAVG)]) as (_, addr):
        results = run_parties(addr, "t", keys, datas, policy=PartyPolicy(min_parties=2))
    for p in PARTIES:
        assert isinstance(results[p], ProtocolError), (p, results[p])
        assert "the model of round 1 is not the head of the model chain (the model round 0's opened sum led to" \
            in str(results[p])


def test_a_member_shown_another_members_vector_makes_everyone_refuse_the_reveal(keys, monkeypatch) -> None:
    """Attack: the coordinator relays c the masked vectors with b's altered (so that c would
    recompute another sum than the one opened). c's confirmation signs other vectors than a's and
    b's: nobody reveals."""
    def swap(party, name, payload):
        if party == "c" and name == "r0.update_vectors":
            forged = payload.copy()
            forged[1] ^= np.uint64(1)  # b's row (members a, b, c)
            return forged
        return None

    rec = Recorder()
    datas = {p: party_data(120 + i) for i, p in enumerate(PARTIES)}
    with hostile(monkeypatch, rewrite=swap), \
            coordinator(allow_list(keys), [job("t", "fedavg", FEDAVG)], observer=rec) as (_, addr):
        results = run_parties(addr, "t", keys, datas, policy=PartyPolicy(min_parties=2))
    for p in PARTIES:
        assert isinstance(results[p], ProtocolError), (p, results[p])
        assert "the coordinator showed the parties different views before r0.update attempt 0" in str(results[p])
    assert not [k for k in rec.seen if k[1] == "r0.update_reveal"]


def test_a_member_whose_own_vector_was_altered_in_the_relay_refuses_at_once(keys, monkeypatch) -> None:
    def swap(party, name, payload):
        if party == "a" and name == "r0.update_vectors":
            forged = payload.copy()
            forged[0] ^= np.uint64(1)  # a's own row
            return forged
        return None

    datas = {p: party_data(125 + i) for i, p in enumerate(PARTIES)}
    with hostile(monkeypatch, rewrite=swap), coordinator(allow_list(keys), [job("t", "fedavg", FEDAVG)]) as (_, addr):
        results = run_parties(addr, "t", keys, datas, policy=PartyPolicy(min_parties=2))
    assert isinstance(results["a"], ProtocolError), results["a"]
    assert "carry another vector for this party than it sent" in str(results["a"])


FULL_BATCH = {**FEDAVG, "rounds": 3, "batch_size": 64}  # 60 rows: one step, so an update depends on θ alone


def test_a_skipped_round_cannot_bring_back_a_model_a_hair_from_an_opened_one(keys, monkeypatch) -> None:
    """Attack (a skipped round): round 0 opens among a, b, c, d; round 1 is skipped; round
    2 releases round 0's θ with one bias moved by one ulp, among a, b, c. The one-sum-per-model rule
    matches exact digests and the old model check compared consecutive rounds only, so both sums
    opened and sum₀ − sum₂ was d's update n_d·Δ_d (to 3e-8). Every party now follows the model chain:
    after round 0 the only model it accepts is θ₁, recomputed from round 0's opened sum."""
    parties = ("a", "b", "c", "d")
    opened: list[np.ndarray] = []
    real_round = FedavgTrainer.round

    def round_(self, scope, t, **kw):
        if t == 1:
            raise PhaseFailed("skipped by the attacker")
        if t == 2:  # round 0's θ, one bias nudged: a new digest, the same model to a hair
            theta = opened_at[0].copy()
            theta[-1] = np.nextafter(theta[-1], np.inf)
            self.net = Network(self.net.arch, theta)
        members = yield from real_round(self, scope, t, **kw)
        return tuple(p for p in members if p != "d") if t == 2 else members

    def keep(self, total):
        opened.append(total.copy())
        return training.decode_update(total, self.params.frac_bits)[1]  # "applied": θ stays θ₀

    opened_at: list[np.ndarray] = []
    real_begin = FedavgTrainer.begin

    def begin(self, dim):
        net = real_begin(self, dim)
        opened_at.append(net.flat.copy())
        return net

    monkeypatch.setattr(FedavgTrainer, "round", round_)
    monkeypatch.setattr(FedavgTrainer, "apply", keep)
    monkeypatch.setattr(FedavgTrainer, "begin", begin)
    rec = Recorder()
    datas = {p: party_data(130 + i) for i, p in enumerate(parties)}
    with coordinator(allow_list(keys), [job("t", "fedavg", FULL_BATCH, parties=parties)], observer=rec) as (_, addr):
        results = run_parties(addr, "t", keys, datas, policy=PartyPolicy(min_parties=2))
    assert {k[3] for k in rec.seen if k[1] == "r0.update_reveal"} == set(parties)  # round 0 was opened
    if len(opened) == 2:  # the attack worked: say what it got before failing
        params = parse_params("fedavg", FULL_BATCH)
        difference = (training.decode_update(opened[0], params.frac_bits)[0]
                      - training.decode_update(opened[1], params.frac_bits)[0])
        seed = next(r.seed for r in results.values() if not isinstance(r, BaseException))
        net = Network(params.architecture(datas["d"].X.shape[1]), opened_at[0])
        update_d, _ = client_update(net, training_set(datas["d"].X, datas["d"].y, None), params.optimiser,
                                    local_rng(seed, "d", 0))
        raise AssertionError(f"round 0 and round 2 both opened; their difference is d's update (norm "
                             f"{np.linalg.norm(update_d):.3g}) to {np.abs(difference - update_d).max():.1e}")
    for p in ("a", "b", "c"):
        assert isinstance(results[p], ProtocolError), (p, results[p])
        assert "the model of round 2 is not the head of the model chain (the model round 0's opened sum led to" \
            in str(results[p])
    assert not [k for k in rec.seen if k[1] == "r2.update"]


def two_of_three_samples(monkeypatch) -> None:
    """Round 0's sample a, b and round 1's b, c: c is first sampled in round 1 (the samples follow
    the parties' common seed; the test fixes them so that one party always comes in late)."""
    fixed = {0: ["a", "b"], 1: ["b", "c"], 2: ["a", "c"]}
    monkeypatch.setattr(training, "sample_parties", lambda seed, t, ordered, fraction: fixed[t])


@pytest.mark.parametrize("how", ["forged", "withheld"])
def test_a_party_a_round_passed_by_follows_the_chain_only_by_the_members_signatures(keys, monkeypatch,
                                                                                     how: str) -> None:
    """Attack: round 0 runs among a and b; c, first sampled in round 1, must take θ₁ on the word of
    round 0's members. The coordinator sends c an attestation of another model (the digest of a
    model of its making, the members' signatures kept), or none at all: c refuses round 1's model,
    since its chain is still at θ₀. (Honestly relayed, c follows: the test with fraction 0.6.)"""
    two_of_three_samples(monkeypatch)

    def forge(party, name, payload):
        if name != "r0.attested" or party != "c":
            return None
        if how == "withheld":
            return b""
        return payload[:32] + training.model_digest(np.zeros(3)) + payload[64:]

    real_send = Run.send

    def send(self, party_id, wire_name, attempt, payload, *, ledger_name):
        if how == "withheld" and wire_name == "r0.attested" and party_id == "c":
            return 0
        return real_send(self, party_id, wire_name, attempt, payload, ledger_name=ledger_name)

    monkeypatch.setattr(Run, "send", send)
    rec = Recorder()
    datas = {p: party_data(140 + i) for i, p in enumerate(PARTIES)}
    with hostile(monkeypatch, rewrite=forge if how == "forged" else None), \
            coordinator(allow_list(keys), [job("t", "fedavg", {**FEDAVG, "fraction": 0.6})], observer=rec) as (_, a):
        results = run_parties(a, "t", keys, datas, policy=PartyPolicy(min_parties=2))
    assert isinstance(results["c"], ProtocolError), results["c"]
    refusal = ("the signature of 'a' does not verify under its identity key" if how == "forged" else
               "the model of round 1 is not the head of the model chain (θ₀ as this party computes it")
    assert refusal in str(results["c"])
    assert ("t", "r1.update", 0, "c") not in rec.seen


def test_honest_rounds_move_every_partys_chain(keys, monkeypatch) -> None:
    """The honest coordinator with c sampled late: round 0's members attest θ₀ → θ₁, c follows it
    and trains in rounds 1 and 2; every party ends with the coordinator's model."""
    two_of_three_samples(monkeypatch)
    rec = Recorder()
    datas = {p: party_data(150 + i) for i, p in enumerate(PARTIES)}
    with coordinator(allow_list(keys), [job("t", "fedavg", {**FEDAVG, "rounds": 3, "fraction": 0.6})],
                     observer=rec) as (coord, addr):
        results = run_parties(addr, "t", keys, datas, policy=PartyPolicy(min_parties=2))
        final = coord.jobs["t"].job.trainer.net.flat
    assert all(not isinstance(r, BaseException) for r in results.values()), results
    assert {k[3] for k in rec.seen if k[1] == "r0.attest"} == {"a", "b"}
    assert ("t", "r1.update", 0, "c") in rec.seen and ("t", "r2.update", 0, "c") in rec.seen
    assert all(np.array_equal(r.aggregate, final) for r in results.values())


@pytest.mark.parametrize("when", ["opened", "another_model"])
def test_a_round_run_again_is_taken_only_before_its_sum_opened_and_with_its_model(keys, monkeypatch,
                                                                                  when: str) -> None:
    """Attack (posing as a coordinator that restarted, server/resume.py): round 0 run again from its
    start among the same parties. Once its sum opened ("opened": the coordinator runs it again after
    every party revealed), a second opening over θ₀ among the same set would let the two sums be
    differenced against fresh noise, or be averaged; each party refuses to mask its update again.
    Before any reveal, but with another model ("another_model": θ₀ nudged), the round would train
    twice, on two models a hair apart: each party refuses that model."""
    from xclp.server.phases.masked_sum import MaskedSum

    real_open, real_complete = MaskedSum._open, MaskedSum.on_step_complete
    again: list[int] = []

    def rerun(self: MaskedSum, step: Step) -> None:
        trainer = self.run.job.trainer
        model = trainer.net.flat if when == "opened" else trainer.net.flat + 1e-6
        self.scope.broadcast(training.MODEL_MSG, 0, model)
        self.scope.start_step(self.name, step.participants, step.attempt + 1)
        again.append(step.attempt + 1)

    def open_(self: MaskedSum) -> None:
        if when == "opened" and self.scope.wire(self.name) == "r0.update" and not again:
            return rerun(self, self.masked)
        return real_open(self)

    def complete(self: MaskedSum, step: Step) -> None:
        if when == "another_model" and step.wire == "r0.update" and not again:
            return rerun(self, step)
        return real_complete(self, step)

    monkeypatch.setattr(MaskedSum, "_open", open_)
    monkeypatch.setattr(MaskedSum, "on_step_complete", complete)
    rec = Recorder()
    datas = {p: party_data(120 + i) for i, p in enumerate(PARTIES)}
    with coordinator(allow_list(keys), [job("t", "fedavg", FEDAVG)], observer=rec) as (_, addr):
        results = run_parties(addr, "t", keys, datas, policy=PartyPolicy(min_parties=2))
    refusal = ("round 0 started again after this party revealed its update sum" if when == "opened" else
               "round 0 started again with another model than the one released for it")
    for p in PARTIES:
        assert isinstance(results[p], ProtocolError), (p, results[p])
        assert refusal in str(results[p])
    assert again == [1] and not [k for k in rec.seen if k[1] == "r0.update" and k[2] == 1]  # nothing masked again
