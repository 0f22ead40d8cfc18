"""A party's own policy (client/policy.py, docs/design.md §2.3-2.4): the jobs it refuses before joining,
and the schedules its step guard refuses. The attacks these refusals defeat, run end to end against
every masked sum, are in tests/threat_model/.
"""

from __future__ import annotations

import pytest

from xclp.client.policy import PartyPolicy, StepGuard
from xclp.errors import PolicyRefused, ProtocolError
from xclp.v1 import xclp_pb2 as pb
from xclp.v1.registry import parse_params
from xclp.v1.status import EXIT_BAD_INPUT, exit_code

FLYNN = {"n_classes": 3, "m": 256, "s": 3, "rho": 8}
PARTIES = ("a", "b", "c")


@pytest.mark.parametrize(("policy", "params", "message"), [
    (PartyPolicy(min_parties=4), {"flynn": FLYNN}, "expects 3 parties; this party masks with at least 4"),
    (PartyPolicy(require_dp=1.0), {"flynn": FLYNN}, "releases without DP"),
    (PartyPolicy(require_dp=1.0), {"flynn": {**FLYNN, "epsilon": 4.0, "T": 5}}, "spends epsilon = 4 in total"),
    (PartyPolicy(), {"xclp": {"n_classes": 3, "hide_label_mask": True}}, "--allow-hide-label-mask"),
    (PartyPolicy(), {"xclp": {"n_classes": 3, "key_bits": 512, "insecure_test_keys": True}}, "below the secure 2048"),
    (PartyPolicy(min_share_threshold=3), {"flynn": FLYNN}, "lets 2 of 3 parties rebuild a self-mask seed; this party "
                                                           "requires at least 3 \\(--min-share-threshold\\)"),
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


@pytest.mark.parametrize("bad", [1, 0, True, 2.5])
def test_min_share_threshold_is_an_integer_never_below_two(bad) -> None:
    with pytest.raises(PolicyRefused, match="--min-share-threshold must be a whole number >= 2 \\(one share would "
                                            "be the seed itself\\)"):
        PartyPolicy(min_share_threshold=bad)


def test_a_strict_share_threshold_takes_a_job_that_asks_as_much_or_where_nothing_can_be_rebuilt() -> None:
    spec = pb.JobSpec(job_id="j", job_type="flynn", expected_parties=list(PARTIES), min_parties=2)
    strict = PartyPolicy(min_share_threshold=3)
    strict.check_job(spec, parse_params("flynn", {**FLYNN, "share_threshold": 3}))  # 3 of 3: nobody is rebuilt
    strict.check_job(with_parties(spec, "abcd"), parse_params("flynn", FLYNN))  # t = 3 of 4


def with_parties(spec: pb.JobSpec, parties: str) -> pb.JobSpec:
    out = pb.JobSpec()
    out.CopyFrom(spec)
    del out.expected_parties[:]
    out.expected_parties.extend(parties)
    return out


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


@pytest.mark.parametrize("name", ["secure_hamming", "r2.secure_hamming"])
def test_securehamming_may_go_on_with_the_same_parties_but_never_a_new_one(name) -> None:
    """A coordinator that restarted goes on with SecureHamming among the same parties (a later
    attempt); it releases only distances the coordinator learns anyway, never a sum. A sum's step
    of the same name elsewhere still needs strictly fewer (the test above)."""
    guard = StepGuard(PartyPolicy(min_parties=2), "a")
    guard.check_step(pb.StepStart(step=name, round=0, participants=["a", "b", "c"]))
    guard.check_step(pb.StepStart(step=name, round=3, participants=["a", "b", "c"]))  # a restarted coordinator
    with pytest.raises(ProtocolError, match="later attempt and no new participant"):
        guard.check_step(pb.StepStart(step=name, round=3, participants=["a", "b"]))  # the same attempt again
    guard.check_step(pb.StepStart(step=name, round=4, participants=["a", "b"]))  # a dropout
    with pytest.raises(ProtocolError, match="later attempt and no new participant"):
        guard.check_step(pb.StepStart(step=name, round=5, participants=["a", "b", "c"]))  # c back
    guard.check_step(pb.StepStart(step="secure_hamming_sum", round=0, participants=["a", "b", "c"]))
    with pytest.raises(ProtocolError, match="strictly fewer"):
        guard.check_step(pb.StepStart(step="secure_hamming_sum", round=1, participants=["a", "b", "c"]))


@pytest.mark.parametrize("name", ["rowsums", "r2.update"])
def test_a_same_set_sum_confirms_again_among_the_same_parties_but_another_sum_never(name) -> None:
    """SecureRowSums and a round's update sum restart among the same parties (a restarted
    coordinator, or a member whose process restarted): their confirm step comes again with them,
    at the later attempt. Before, the masked step was let through and its confirm refused, so a
    restart that came during the confirm step failed the run. A confirm of any other sum still
    needs strictly fewer parties, and a same-set confirm never takes a new one."""
    guard = StepGuard(PartyPolicy(min_parties=2), "a")
    three = ["a", "b", "c"]
    for attempt in (0, 1):
        guard.check_step(pb.StepStart(step=name, round=attempt, participants=three))
        guard.check_step(pb.StepStart(step=f"{name}_confirm", round=attempt, participants=three))
    guard.check_step(pb.StepStart(step=f"{name}_confirm", round=2, participants=["a", "b"]))
    with pytest.raises(ProtocolError, match="later attempt and no new participant"):
        guard.check_step(pb.StepStart(step=f"{name}_confirm", round=3, participants=three))
    guard.check_step(pb.StepStart(step="sum_confirm", round=0, participants=three))
    with pytest.raises(ProtocolError, match="strictly fewer"):
        guard.check_step(pb.StepStart(step="sum_confirm", round=1, participants=three))


def test_the_labeled_rows_may_be_asked_again_among_the_same_parties_three_times_never_with_a_new_one() -> None:
    """A coordinator restarted in XCLP's labels step asks again at a later attempt among the same
    parties (the same row numbers go out: nothing new); a loop of it is refused at the fourth, and a
    party that was not in it never joins it."""
    guard = StepGuard(PartyPolicy(min_parties=2), "a")
    guard.check_step(pb.StepStart(step="labeled_sets", round=0, participants=["a", "b", "c"]))
    for attempt in (12, 24, 36):
        guard.check_step(pb.StepStart(step="labeled_sets", round=attempt, participants=["a", "b", "c"]))
    with pytest.raises(ProtocolError, match="restarted among the same parties 4 times"):
        guard.check_step(pb.StepStart(step="labeled_sets", round=48, participants=["a", "b", "c"]))
    other = StepGuard(PartyPolicy(min_parties=2), "a")
    other.check_step(pb.StepStart(step="labeled_sets", round=0, participants=["a", "b"]))
    with pytest.raises(ProtocolError, match="later attempt and no new participant"):
        other.check_step(pb.StepStart(step="labeled_sets", round=12, participants=["a", "b", "c"]))
