"""The coordinator's masked-sum phase (server/phases/masked_sum.py) driven in a run without sockets:
per-sender shapes and limits, what it opens, the digest its reveals bind, and its restarts."""

from __future__ import annotations

import functools

import numpy as np
import pytest

from tests.harness import admit, allow_list, job
from tests.server.test_run import FLYNN, Clock, drain, msg, summary
from xclp.crypto import shamir
from xclp.errors import InvalidInput
from xclp.server.events import Stage
from xclp.server.jobs.base import CoordinatorJob
from xclp.server.phases.masked_sum import MaskedSum, SumResult
from xclp.server.run import Run
from xclp.v1 import wire
from xclp.v1.double_masking import (
    SEALED_SHARE_BYTES,
    Confirmation,
    commit_seed,
    pack_reveal,
    recover_digest,
    reveal_digest,
    self_mask,
    share_threshold,
)

SEEDS = {p: bytes([i + 1]) * 32 for i, p in enumerate("abcd")}


class RowsJob(CoordinatorJob):
    """One masked sum whose senders send arrays of their own widths, as SecureRowSums does."""

    opened: dict = {}
    result: SumResult | None = None
    per_member = 0  # more words per participant: frames that shrink a lot when the set does

    def program(self, run):
        RowsJob.opened, RowsJob.result = {}, None
        def shape(sender, participants):
            return np.dtype(np.uint64), (2 + len(participants) * (1 + RowsJob.per_member) + "abcd".index(sender),)

        def keep(opened, participants):
            RowsJob.opened = dict(opened)
            return sum(int(v.sum()) for v in opened.values())

        RowsJob.result = yield MaskedSum(run.scope, "rows", wire=shape, combine=keep, digest_name="rows")
        return "done"


def seeded_run(keys, parties: str = "abc") -> Run:
    config = job("j", "flynn", FLYNN, parties=tuple(parties))
    run = Run(config, allow_list(keys), clock=Clock(), job=RowsJob(config))
    for p in parties:
        admit(run, keys, p, summary())
    for p in parties:
        run.message(p, msg("seed", 0, p, b""))
    return run


def confirmation(run: Run, party: str, attempt: int) -> bytes:
    """`party`'s confirmation: a transcript hash, its commitment to its seed (which the coordinator
    checks every revealed or rebuilt seed against) and a signature (the parties check those)."""
    return Confirmation(bytes([ord(party)]) * 32, commit_seed(run.session_id, "rows", attempt, party, SEEDS[party]),
                        bytes([ord(party)]) * 64).pack()


def confirm(run: Run, parties: str, attempt: int) -> None:
    for p in parties:
        run.message(p, msg(run.step.wire, attempt, p, confirmation(run, p, attempt)))


def contribution(sender: str, n: int, attempt_values: int) -> np.ndarray:
    values = np.full(2 + n + "abcd".index(sender), attempt_values, dtype=np.uint64)
    return values + self_mask(SEEDS[sender], values.shape, values.dtype)


def test_each_sender_has_its_own_shape_and_limit_and_the_sum_opens_minus_the_self_masks(keys) -> None:
    run = seeded_run(keys)
    assert run.step.name == "rows" and run.payload_limit("c", "rows", "") == 8 * (2 + 3 + 2)
    with pytest.raises(InvalidInput, match=r"the masked array from 'a' must be <u8\[5\], got <u8\[6\]"):
        run.message("a", msg("rows", 0, "a", np.zeros(6, np.uint64)))
    for p in "abc":
        run.message(p, msg("rows", 0, p, contribution(p, 3, 1)))
    assert run.step.name == "rows_confirm" and run.payload_limit("a", "rows_confirm", "") == 128
    with pytest.raises(InvalidInput, match="a confirmation is 128 opaque bytes"):
        run.message("a", msg("rows_confirm", 0, "a", bytes(127)))
    confirm(run, "abc", 0)
    relayed = [i.frame for i in drain(run, "b") if i.WhichOneof("item") == "frame" and i.frame.step == "rows_confirm"]
    assert [f.data for f in relayed] == [b"".join(confirmation(run, p, 0) for p in "abc")]  # all, in member order
    assert run.step.name == "rows_reveal" and run.payload_limit("a", "rows_reveal", "") == 64
    for p in "abc":
        run.message(p, msg("rows_reveal", 0, p, pack_reveal(reveal_digest(run.session_id, "rows", 0, "abc"), SEEDS[p])))
    assert run.stage is Stage.DONE
    assert {p: v.tolist() for p, v in RowsJob.opened.items()} == {p: [1] * (5 + i) for i, p in enumerate("abc")}
    assert RowsJob.result == SumResult(5 + 6 + 7, 0, ("a", "b", "c"))


def reveal(run: Run, party: str, attempt: int, members: str) -> None:
    run.message(party, msg("rows_reveal", attempt, party,
                           pack_reveal(reveal_digest(run.session_id, "rows", attempt, members), SEEDS[party])))


@functools.cache
def dealt(party: str, holders: int) -> dict[int, bytes]:
    """`party`'s shares of its seed among `holders` parties (one polynomial, as a party deals it)."""
    return shamir.split(SEEDS[party], share_threshold(0, holders), range(1, holders + 1))


def recovery(run: Run, giver: str, attempt: int, holders: str, givers: str) -> bytes:
    """`giver`'s answer in the recover step: the digest and its share of every lost holder's seed."""
    lost = [p for p in holders if p not in givers]
    shares = [dealt(p, len(holders))[holders.index(giver) + 1] for p in lost]
    return recover_digest(run.session_id, "rows", attempt, holders, givers) + b"".join(shares)


def test_a_loss_restarts_the_sum_with_the_rest_and_their_new_shapes(keys) -> None:
    run = seeded_run(keys, "abcd")
    run.message("a", msg("rows", 0, "a", contribution("a", 4, 1)))
    run.disconnected("d")
    assert (run.step.name, run.step.attempt, run.step.participants) == ("rows", 1, ("a", "b", "c"))
    assert run.payload_limit("b", "rows", "") == 8 * (2 + 3 + 1)  # the frame shrank with the set
    assert [i.step.round for i in drain(run, "a") if i.WhichOneof("item") == "step"][-1] == 1
    # b's attempt-0 contribution, pushed before it heard of the restart, is of attempt 0's larger
    # frame: read and ignored, not refused as oversized (which ended b's part in the job)
    assert run.payload_limit("b", "rows", "", 0) == 8 * (2 + 4 + 1)
    run.message("b", msg("rows", 0, "b", contribution("b", 4, 1)))
    assert run.step.attempt == 1 and "b" in run.step.participants


def test_a_payload_of_a_given_up_attempt_that_arrives_after_its_step_is_over_is_read_and_ignored(
        keys, monkeypatch) -> None:
    """b's attempt-0 array comes after the restart's attempt 1 completed (the step is over): it is
    as large as attempt 0 allowed b, larger than anything attempt 1 or a's attempt-0 array took.
    It was refused as oversized ("a 'rows' message of 3256 bytes exceeds the 3248 bytes that step
    can need"), which ended b's part in the job; now it is read and ignored as late."""
    monkeypatch.setattr(RowsJob, "per_member", 100)
    run = seeded_run(keys, "abcd")
    run.message("a", msg("rows", 0, "a", contribution_of("a", 4, 1)))
    run.disconnected("d")
    for p in "abc":
        run.message(p, msg("rows", 1, p, contribution_of(p, 3, 1)))
    assert run.step.name == "rows_confirm"
    late = contribution_of("b", 4, 1)
    assert late.nbytes == 8 * (2 + 4 * 101 + 1) > 8 * (2 + 4 * 101 + 0)  # above a's attempt-0 array
    assert run.payload_limit("b", "rows", "", 0) >= late.nbytes
    run.message("b", msg("rows", 0, "b", late))  # read and ignored
    assert run.step.name == "rows_confirm" and "b" in run.active


def contribution_of(sender: str, n: int, attempt_values: int) -> np.ndarray:
    """`contribution` at RowsJob.per_member's widths."""
    values = np.full(2 + n * (1 + RowsJob.per_member) + "abcd".index(sender), attempt_values, dtype=np.uint64)
    return values + self_mask(SEEDS[sender], values.shape, values.dtype)


def test_a_holder_lost_while_revealing_is_rebuilt_from_the_others_shares_and_the_sum_opens_over_all(keys) -> None:
    run = seeded_run(keys, "abcd")
    assert run.payload_limit("a", "rows", "b") == SEALED_SHARE_BYTES  # a share relayed to b
    for p in "abcd":
        run.message(p, msg("rows", 0, p, contribution(p, 4, 1)))
    confirm(run, "abcd", 0)
    reveal(run, "a", 0, "abcd")
    run.disconnected("c")  # revealed nothing: its seed is rebuilt, t = 3 of 4
    reveal(run, "b", 0, "abcd")
    reveal(run, "d", 0, "abcd")
    assert (run.step.name, run.step.attempt, run.step.participants) == ("rows_recover", 0, ("a", "b", "d"))
    assert run.payload_limit("a", "rows_recover", "") == 32 + 66
    with pytest.raises(InvalidInput, match="another session, attempt or set"):
        run.message("a", msg("rows_recover", 0, "a", recovery(run, "a", 0, "abcd", "ab")[:32] + bytes(66)))
    for p in "abd":
        run.message(p, msg("rows_recover", 0, p, recovery(run, p, 0, "abcd", "abd")))
    assert run.stage is Stage.DONE and RowsJob.result == SumResult(6 + 7 + 8 + 9, 0, tuple("abcd"))
    assert run.ledger["rows"].recovered == ["c in rows"]


def test_a_giver_lost_while_recovering_fails_the_sum_when_fewer_than_t_are_left(keys) -> None:
    run = seeded_run(keys, "abcd")
    for p in "abcd":
        run.message(p, msg("rows", 0, p, contribution(p, 4, 1)))
    confirm(run, "abcd", 0)
    for p in "abd":
        reveal(run, p, 0, "abcd")
    run.disconnected("c")
    assert run.step.name == "rows_recover"
    run.message("a", msg("rows_recover", 0, "a", recovery(run, "a", 0, "abcd", "abd")))
    run.disconnected("b")  # a and d are left: 2 < t = 3
    assert run.stage is Stage.FAILED and RowsJob.result is None
    assert "c left while the 'rows' sum was opened, and it cannot be: 4 parties share a seed t = 3 of n, and only " \
           "2 holders are left" in run.outcome_reason


def test_a_sum_of_two_cannot_rebuild_a_lost_seed(keys) -> None:
    run = seeded_run(keys, "ab")
    with pytest.raises(InvalidInput, match="'rows' attempt 0 carries no peer-to-peer messages"):
        run.message("a", msg("rows", 0, "a", bytes(SEALED_SHARE_BYTES), recipient="b"))  # t = 2 of 2: no shares
    for p in "ab":
        run.message(p, msg("rows", 0, p, contribution(p, 2, 1)))
    confirm(run, "ab", 0)
    reveal(run, "a", 0, "ab")
    run.disconnected("b")
    assert run.stage is Stage.FAILED and RowsJob.result is None


def test_a_loss_while_confirming_restarts_the_sum_since_nobody_revealed(keys) -> None:
    run = seeded_run(keys, "abcd")
    for p in "abcd":
        run.message(p, msg("rows", 0, p, contribution(p, 4, 1)))
    run.message("a", msg("rows_confirm", 0, "a", confirmation(run, "a", 0)))
    run.disconnected("b")
    assert (run.step.name, run.step.attempt, run.step.participants) == ("rows", 1, ("a", "c", "d"))
    for p in "acd":
        run.message(p, msg("rows", 1, p, contribution(p, 3, 1)))
    confirm(run, "acd", 1)
    for p in "acd":
        run.message(p, msg("rows_reveal", 1, p, pack_reveal(reveal_digest(run.session_id, "rows", 1, "acd"), SEEDS[p])))
    assert run.stage is Stage.DONE and RowsJob.result == SumResult(5 + 7 + 8, 1, ("a", "c", "d"))


def test_a_reveal_is_refused_unless_it_binds_this_session_attempt_set_and_the_phases_name(keys) -> None:
    run = seeded_run(keys)
    for p in "abc":
        run.message(p, msg("rows", 0, p, contribution(p, 3, 1)))
    confirm(run, "abc", 0)
    for wrong in (reveal_digest(run.session_id, "r0.rows", 0, "abc"), reveal_digest(run.session_id, "rows", 1, "abc"),
                  reveal_digest(run.session_id, "rows", 0, "ab"), reveal_digest(bytes(32), "rows", 0, "abc")):
        with pytest.raises(InvalidInput, match="another session, attempt or participant set"):
            run.message("a", msg("rows_reveal", 0, "a", pack_reveal(wrong, SEEDS["a"])))
    with pytest.raises(InvalidInput, match="64 opaque bytes"):
        run.message("a", wire.Message("j", "rows_reveal", 0, "a", "", np.zeros(8, np.uint64)))
