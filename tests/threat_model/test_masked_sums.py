"""Attacks on the masked sums (docs/design.md §2.4, §6.1), tried on every masked step of every job type.

Every masked sum of the service is one phase on each side (server/phases/masked_sum.py,
client/phases/masked_sum.py), so each attack here is the real coordinator with one transition of
that phase changed, as an attacker would change it, run against the real parties of each job type
in turn: FlyNN's "sum", the preparation's "moments", XCLP's "rowsums", the training rounds'
"r0.update" (fedavg and dbcl). The honest parties must refuse before they send anything the
attacker could use, and the attacker must end with no sum it could open.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from tests.harness import PARTIES, Recorder, allow_list, coordinator, job, party_data, run_parties
from xclp.client.jobs.allreduce import flynn_counts
from xclp.client.policy import PartyPolicy
from xclp.client.run_config import JobResult
from xclp.client.session import PartySession
from xclp.crypto.masking import ring_sum
from xclp.crypto.paillier import PaillierKeypair
from xclp.errors import ProtocolError
from xclp.server.phases.base import Step
from xclp.server.phases.masked_sum import MaskedSum
from xclp.v1 import xclp_pb2 as pb
from xclp.v1.registry import parse_params

FLYNN = {"n_classes": 3, "m": 64, "s": 3, "rho": 8}
POLICY = PartyPolicy(min_parties=2, insecure_test_keys=True, allow_non_dp_dbcl=True)  # DBCL: the sums, not its DP
REAL_COMPLETE, REAL_START = MaskedSum.on_step_complete, MaskedSum.start


@dataclass(frozen=True)
class Target:
    """A masked step of a job type: its job, its wire name, and whether losing it skips a round."""

    job_type: str
    params: dict
    step: str
    skips_a_round: bool = False
    paillier: bool = False

    def __str__(self) -> str:
        return f"{self.job_type}-{self.step}"


TARGETS = [
    Target("flynn", FLYNN, "sum"),
    Target("flynn", {**FLYNN, "standardise": True}, "moments"),
    Target("xclp", {"n_classes": 3, "k": 4, "lsh_bits": 64, "key_bits": 512, "insecure_test_keys": True}, "rowsums",
           paillier=True),
    Target("fedavg", {"n_classes": 3, "hidden": [4], "rounds": 2, "local_epochs": 1, "batch_size": 8}, "r0.update",
           skips_a_round=True),
    Target("dbcl", {"n_classes": 3, "hidden": [4], "rounds": 2, "batch_size": 8}, "r0.update", skips_a_round=True),
]


@pytest.fixture(scope="module")
def paillier() -> dict[str, PaillierKeypair]:
    return {p: PaillierKeypair.generate(512, allow_insecure_test_size=True) for p in PARTIES}


def attack(monkeypatch, target: Target, on_complete=None, start=None) -> None:
    """The coordinator's masked-sum phase with one transition replaced, for `target`'s step only."""
    def complete(self: MaskedSum, step: Step) -> None:
        if on_complete is not None and self.scope.wire(self.name) == target.step:
            on_complete(self, step)
        else:
            REAL_COMPLETE(self, step)

    def begin(self: MaskedSum) -> None:
        if start is not None and self.scope.wire(self.name) == target.step:
            start(self)
        else:
            REAL_START(self)

    monkeypatch.setattr(MaskedSum, "on_step_complete", complete)
    monkeypatch.setattr(MaskedSum, "start", begin)


def run_target(keys, target: Target, paillier, **kw) -> tuple[dict, Recorder, object]:
    rec = Recorder()
    datas = {p: party_data(20 + i) for i, p in enumerate(PARTIES)}
    with coordinator(allow_list(keys), [job("t", target.job_type, target.params)], observer=rec) as (coord, address):
        results = run_parties(address, "t", keys, datas, policy=POLICY,
                              paillier=paillier if target.paillier else None, **kw)
        run = coord.jobs["t"]
    return results, rec, run


def pushed(rec: Recorder, step: str, attempt: int | None = None) -> set[str]:
    return {k[3] for k in rec.seen if k[1] == step and (attempt is None or k[2] == attempt)}


@pytest.mark.parametrize("target", TARGETS, ids=str)
def test_a_lie_about_a_dropout_gets_no_sum_opened(keys, paillier, monkeypatch, target: Target) -> None:
    """Attack (lying about a dropout): attempt 0 completes among a, b, c; the coordinator claims c
    dropped, runs attempt 1 among a and b, then asks all three to open attempt 0. The difference of
    the two sums would be c's contribution; a and b reveal for their latest attempt only."""
    def lie(self: MaskedSum, step: Step) -> None:
        if step.name == self.name and step.attempt == 0:
            self.scope.start_step(self.name, ["a", "b"], 1)  # "c dropped"
        elif step.name == self.name:
            self.scope.start_step(self.reveal, ["a", "b", "c"], 0)  # now open attempt 0, please
        else:
            REAL_COMPLETE(self, step)

    attack(monkeypatch, target, on_complete=lie)
    results, rec, _ = run_target(keys, target, paillier)
    for p in ("a", "b"):
        assert isinstance(results[p], ProtocolError), results[p]
        assert "which this party left for attempt 1" in str(results[p]), results[p]
    assert pushed(rec, target.step, 1) == {"a", "b"}  # the lie was believed as far as it could be
    assert pushed(rec, target.step + "_reveal") <= {"c"}  # but a and b opened nothing


@pytest.mark.parametrize("target", TARGETS, ids=str)
def test_a_repeated_attempt_with_the_same_parties_is_refused(keys, paillier, monkeypatch, target: Target) -> None:
    """Attack (averaging away noise, differencing): a complete attempt run again among the same
    parties; each attempt would draw fresh DP noise or fresh masks over the same values."""
    def again(self: MaskedSum, step: Step) -> None:
        if step.name == self.name:
            self.scope.start_step(step.name, step.participants, step.attempt + 1)
        else:
            REAL_COMPLETE(self, step)

    attack(monkeypatch, target, on_complete=again)
    results, rec, _ = run_target(keys, target, paillier)
    if target.step.endswith(".update") or target.step == "rowsums":
        # a training round's update sum and SecureRowSums may go on among the same parties, as after
        # their coordinator restarted (client/policy.py): each attempt masks the same value (noise
        # included) under fresh masks and none is opened but the latest; in a loop, the parties stop
        # at the fourth
        for p in PARTIES:
            assert isinstance(results[p], ProtocolError), results[p]
            assert "restarted among the same parties 4 times (at most 3" in str(results[p]), results[p]
        assert all(pushed(rec, target.step, a) == set(PARTIES) for a in range(4))
        assert pushed(rec, target.step, 4) == set() and pushed(rec, target.step + "_reveal") == set()
        return
    for p in PARTIES:
        assert isinstance(results[p], ProtocolError) and "strictly fewer participants" in str(results[p]), results[p]
    assert pushed(rec, target.step, 1) == set() and pushed(rec, target.step + "_reveal") == set()


@pytest.mark.parametrize("target", TARGETS, ids=str)
def test_a_sum_among_one_party_is_refused(keys, paillier, monkeypatch, target: Target) -> None:
    """Attack: the masked step started with a alone, so its "sum" would be a's own values."""
    def lonely(self: MaskedSum) -> None:
        self.scope.start_step(self.name, ["a"], 0)

    attack(monkeypatch, target, start=lonely)
    results, rec, _ = run_target(keys, target, paillier)
    assert isinstance(results["a"], ProtocolError), results["a"]
    assert "has 1 participants, fewer than this party's minimum of 2" in str(results["a"])
    assert pushed(rec, target.step) == set()


@pytest.mark.parametrize("target", TARGETS, ids=str)
def test_a_party_lost_while_revealing_is_rebuilt_from_shares_and_no_attempt_follows(keys, paillier,
                                                                                      target: Target) -> None:
    """The honest coordinator: c dies as the reveal starts. a and b revealed their seeds, so no later
    attempt may run (its difference with this one would be c's values): the coordinator asks a and b
    (t = 2 of 3) for their shares of c's seed and opens the sum over all three. The job
    goes on among a and b; FlyNN's counts are the pooled counts of all three tables."""
    class DiesRevealing(PartySession):
        def on_step(self, step: pb.StepStart) -> None:
            if step.step == target.step + "_reveal":
                raise KeyboardInterrupt("killed while revealing")
            super().on_step(step)

    results, rec, run = run_target(keys, target, paillier, sessions={"c": DiesRevealing})
    assert isinstance(results["c"], KeyboardInterrupt)
    assert all(isinstance(results[p], JobResult) for p in "ab"), results
    assert pushed(rec, target.step, 1) == set()  # no second attempt after a reveal
    assert pushed(rec, target.step + "_reveal") == {"a", "b"} and pushed(rec, target.step + "_recover") == {"a", "b"}
    assert run.ledger.recovered == [f"c in {target.step}"]
    if target.skips_a_round:  # round 0 has c's update in it; round 1 runs without c
        assert run.job.skipped == [] and [h["parties"] for h in run.job.history] == [["a", "b", "c"], ["a", "b"]]
    if target.step == "sum":
        seed = results["a"].seed
        pooled = sum(flynn_counts(parse_params("flynn", FLYNN), party_data(20 + i), seed) for i in range(3))
        assert all(np.array_equal(results[p].aggregate, pooled) for p in "ab")


def test_a_sum_after_the_result_is_refused(keys, monkeypatch) -> None:
    """Attack: the coordinator hands out a "result", then starts one more sum among a and b; its
    difference with the first would be c's counts. No party takes part in a sum after its result."""
    def greedy(self: MaskedSum, step: Step) -> None:
        total = ring_sum(np.asarray(step.received[p]) for p in step.participants)
        self.scope.broadcast("result", step.attempt, total, to=step.participants)
        self.scope.start_step("sum", [p for p in step.participants if p != "c"], step.attempt + 1)

    attack(monkeypatch, TARGETS[0], on_complete=greedy)
    results, rec, _ = run_target(keys, TARGETS[0], None)
    for p in ("a", "b"):
        assert isinstance(results[p], ProtocolError), results[p]
        assert "after this party received the job's result" in str(results[p])
    assert pushed(rec, "sum", 1) == set()


def test_the_liars_two_sums_do_not_difference_to_the_dropped_partys_counts(keys, monkeypatch) -> None:
    """What the liar of the first test holds, for FlyNN: two masked sums whose difference would be
    c's counts without the self masks; with them it is noise."""
    seeds: list[bytes] = []

    class SeedKeeper(PartySession):  # the test, not the coordinator, reads the common seed
        def _seeded(self) -> None:
            super()._seeded()
            if self.member is not None and self.member.seed.seed is not None:
                seeds.append(self.member.seed.seed)

    def lie(self: MaskedSum, step: Step) -> None:
        if step.attempt == 0:
            self.scope.start_step(self.name, ["a", "b"], 1)
        else:
            self.scope.start_step(self.reveal, ["a", "b", "c"], 0)

    target = TARGETS[0]
    attack(monkeypatch, target, on_complete=lie)
    rec = Recorder()
    datas = {p: party_data(10 + i) for i, p in enumerate(PARTIES)}
    with coordinator(allow_list(keys), [job("t", "flynn", FLYNN)], observer=rec) as (_, address):
        run_parties(address, "t", keys, datas, policy=POLICY, session=SeedKeeper)
    attempt0 = ring_sum(np.asarray(rec.seen[("t", "sum", 0, p)]) for p in PARTIES)
    attempt1 = ring_sum(np.asarray(rec.seen[("t", "sum", 1, p)]) for p in ("a", "b"))
    counts_c = flynn_counts(parse_params("flynn", FLYNN), datas["c"], seeds[0])
    assert np.mean((attempt0 - attempt1) == counts_c) < 0.01  # not even close


def test_secure_row_sums_run_again_only_before_they_are_opened(keys, paillier, monkeypatch) -> None:
    """Attack (posing as a coordinator that restarted after SecureHamming, server/resume.py): once
    SecureRowSums is opened, the graph layout sent again and the sum asked for again among the same
    parties. A second opening of Z̄ under fresh label-DP noise would average the noise away; each
    party refuses the layout again, before any influence column or masked row sum."""
    from xclp.server.jobs.xclp import XclpJob
    from xclp.v1.xclp import GRAPH_MSG

    target = TARGETS[2]
    real_open = MaskedSum._open
    again: list[int] = []

    def open_(self: MaskedSum) -> None:
        if self.name != "rowsums" or again:
            return real_open(self)
        state = self.run.job.xclp
        assert isinstance(self.run.job, XclpJob) and state is not None
        self.scope.broadcast(GRAPH_MSG, 0, state.rows(state.membership.graph))
        self.scope.start_step(self.name, self.masked.participants, self.masked.attempt + 1)
        again.append(self.masked.attempt + 1)

    monkeypatch.setattr(MaskedSum, "_open", open_)
    results, rec, _ = run_target(keys, target, paillier)
    for p in PARTIES:
        assert isinstance(results[p], ProtocolError), results[p]
        assert "sent the graph layout again after this party revealed its row sums" in str(results[p])
    assert again == [1] and pushed(rec, "rowsums", 1) == set()
