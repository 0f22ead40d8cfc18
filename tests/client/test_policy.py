"""A party enforces its own policy against an active coordinator (DESIGN §2.3-2.4).

Each hostile coordinator here is the real one with one transition changed, as an attacker would
change it; the honest parties must refuse before they push anything it could exploit.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.service.conftest import Recorder, allow_list, coordinator, job, party_data, run_parties
from xclp.client.policy import PartyPolicy, StepGuard
from xclp.client.jobs.allreduce import flynn_counts
from xclp.client.session import PartySession
from xclp.crypto.masking import ring_sum
from xclp.errors import PolicyRefused, ProtocolError
from xclp.server import coordinator as coordinator_module
from xclp.server.jobs.allreduce import AllReduceJob
from xclp.v1 import xclp_pb2 as pb
from xclp.v1.jobs import parse_params
from xclp.v1.status import EXIT_BAD_INPUT, EXIT_PROTOCOL, exit_code

FLYNN = {"n_classes": 3, "m": 256, "s": 3, "rho": 8}
PARTIES = ("a", "b", "c")


def hostile(monkeypatch, cls: type[AllReduceJob]) -> None:
    monkeypatch.setitem(coordinator_module.JOB_TYPES, "flynn", cls)


def test_a_party_refuses_a_sum_among_itself_alone(keys, monkeypatch):
    """Attack: a `sum` step whose only participant is a makes it push its counts unmasked."""
    class Lonely(AllReduceJob):
        def begin(self) -> None:
            self.start_step("sum", ["a"])

    hostile(monkeypatch, Lonely)
    rec = Recorder()
    with coordinator(allow_list(keys), [job("f", "flynn", FLYNN)], observer=rec) as (coord, addr):
        results = run_parties(addr, "f", keys, {p: party_data(i) for i, p in enumerate(PARTIES)},
                              policy=PartyPolicy(min_parties=2))
    assert isinstance(results["a"], ProtocolError) and exit_code(results["a"]) == EXIT_PROTOCOL
    assert "has 1 participants, fewer than this party's minimum of 2" in str(results["a"])
    assert not [k for k in rec.seen if k[1] == "sum" and k[3] == "a"]  # a pushed nothing


def test_a_party_refuses_a_second_round_with_the_same_set_and_a_sum_after_the_result(keys, monkeypatch):
    """Attacks: repeating a complete round with the same participants (each redraws DP noise, which
    the coordinator could then average away), and starting a sum after the result."""
    class Repeating(AllReduceJob):
        def on_step_complete(self, step) -> None:
            if step.round == 0:
                self.start_step("sum", list(step.participants))  # "again, please"
            else:
                super().on_step_complete(step)

    class Greedy(AllReduceJob):
        def on_step_complete(self, step) -> None:
            total = ring_sum(np.asarray(step.received[p]) for p in step.participants)
            for pid in step.participants:
                self.send(pid, "result", step.round, total)
            self.start_step("sum", [p for p in step.participants if p != "c"])  # one more sum, after the result

    datas = {p: party_data(i) for i, p in enumerate(PARTIES)}
    params = {**FLYNN, "epsilon": 1.0, "T": 20}
    for cls, message in ((Repeating, "strictly fewer participants"), (Greedy, "after this party received")):
        hostile(monkeypatch, cls)
        rec = Recorder()
        with coordinator(allow_list(keys), [job("f", "flynn", params)], observer=rec) as (coord, addr):
            results = run_parties(addr, "f", keys, datas, policy=PartyPolicy(min_parties=2))
        for p in ("a", "b"):
            assert isinstance(results[p], ProtocolError) and message in str(results[p]), results[p]
        assert not [k for k in rec.seen if k[1] == "sum" and k[2] == 1]  # no second array reached it


@pytest.mark.parametrize(("policy", "params", "message"), [
    (PartyPolicy(min_parties=4), {"flynn": FLYNN}, "expects 3 parties; this party masks with at least 4"),
    (PartyPolicy(require_dp=1.0), {"flynn": FLYNN}, "releases without DP"),
    (PartyPolicy(require_dp=1.0), {"flynn": {**FLYNN, "epsilon": 4.0, "T": 5}}, "uses epsilon = 4.0"),
    (PartyPolicy(), {"xclp": {"n_classes": 3, "hide_label_mask": True}}, "--allow-hide-label-mask"),
    (PartyPolicy(), {"xclp": {"n_classes": 3, "key_bits": 512, "insecure_test_keys": True}}, "below the secure 2048"),
])
def test_the_party_refuses_a_job_its_policy_does_not_accept(policy, params, message) -> None:
    ((job_type, raw),) = params.items()
    spec = pb.JobSpec(job_id="j", job_type=job_type, expected_parties=list(PARTIES), min_parties=2)
    with pytest.raises(PolicyRefused, match=message) as info:
        policy.check_job(spec, parse_params(job_type, raw))
    assert exit_code(info.value) == EXIT_BAD_INPUT
    PartyPolicy(min_parties=3, require_dp=8.0, allow_hide_label_mask=True, insecure_test_keys=True).check_job(
        spec, parse_params("flynn", {**FLYNN, "epsilon": 4.0, "T": 5}))  # a permissive policy takes it


def test_min_parties_is_never_below_two() -> None:
    with pytest.raises(PolicyRefused, match=">= 2"):
        PartyPolicy(min_parties=1)


def test_the_step_guard_accepts_only_strictly_shrinking_restarts() -> None:
    guard = StepGuard(PartyPolicy(min_parties=2), "a")
    guard.check_step(pb.StepStart(step="sum", round=0, participants=["a", "b", "c"]))
    with pytest.raises(ProtocolError, match="strictly fewer"):
        guard.check_step(pb.StepStart(step="sum", round=1, participants=["a", "b", "c"]))
    with pytest.raises(ProtocolError, match="strictly fewer"):
        guard.check_step(pb.StepStart(step="sum", round=0, participants=["a", "b"]))  # an old round number
    guard.check_step(pb.StepStart(step="sum", round=1, participants=["a", "c"]))  # a real restart
    with pytest.raises(ProtocolError, match="does not include this party"):
        guard.check_step(pb.StepStart(step="rowsums", round=0, participants=["b", "c"]))


def test_a_coordinator_lying_about_a_dropout_cannot_difference_two_sums(keys, monkeypatch):
    """Attack (lying about a dropout): the coordinator completes a round with a, b, c, claims c
    dropped and restarts with a, b; the difference of the two sums would be c's counts. Under
    double masking neither round opens without the self-mask seeds, and a, b reveal one round only:
    here it asks for round 0 after round 1, and they refuse."""
    class Liar(AllReduceJob):
        def on_step_complete(self, step) -> None:
            if step.name == "sum" and step.round == 0:
                self.round0 = step
                self.start_step("sum", ["a", "b"])  # "c dropped"
            elif step.name == "sum" and step.round == 1:
                self.round1 = step
                self.start_step("sum_reveal", ["a", "b", "c"], round=0)  # now open round 0, please
            else:
                super().on_step_complete(step)

    seeds: list[bytes] = []

    class SeedKeeper(PartySession):  # the test, not the coordinator, reads the common seed
        def _have_seed(self, seed, step) -> None:
            seeds.append(seed)
            super()._have_seed(seed, step)

    hostile(monkeypatch, Liar)
    rec = Recorder()
    datas = {p: party_data(10 + i) for i, p in enumerate(PARTIES)}
    with coordinator(allow_list(keys), [job("f", "flynn", FLYNN)], observer=rec) as (coord, addr):
        results = run_parties(addr, "f", keys, datas, policy=PartyPolicy(min_parties=2), session=SeedKeeper)
    for p in ("a", "b"):
        assert isinstance(results[p], ProtocolError) and "abandoned for round 1" in str(results[p]), results[p]
    assert not [k for k in rec.seen if k[1] == "sum_reveal" and k[3] in ("a", "b")]
    # what the liar holds: two masked sums, whose difference would be c's counts without self masks
    round0 = ring_sum(np.asarray(rec.seen[("f", "sum", 0, p)]) for p in PARTIES)
    round1 = ring_sum(np.asarray(rec.seen[("f", "sum", 1, p)]) for p in ("a", "b"))
    counts_c = flynn_counts(parse_params("flynn", FLYNN), datas["c"], seeds[0])
    assert not np.array_equal(round0 - round1, counts_c)
    assert np.mean((round0 - round1) == counts_c) < 0.01  # not even close
