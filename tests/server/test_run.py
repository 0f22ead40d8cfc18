"""A run on the coordinator driven directly, without sockets (STYLE §2–3): admission, routing,
relays, deadlines, drops (server/run.py)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.harness import admit, allow_list, job
from xclp.crypto import identity
from xclp.errors import InvalidInput, NotAuthorized, ProtocolError, ResourceExhausted
from xclp.server import mailbox as mailbox_module
from xclp.server.events import Stage
from xclp.server.jobs.allreduce import AllReduceJob
from xclp.server.jobs.base import CoordinatorJob
from xclp.server.phases.base import Phase, Step
from xclp.server.run import Run
from xclp.v1 import wire
from xclp.v1 import xclp_pb2 as pb
from xclp.v1.double_masking import Confirmation, commit_seed, pack_reveal, reveal_digest, self_mask

FLYNN = {"n_classes": 2, "m": 8, "s": 2, "rho": 2}


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Blob(Phase):
    """A step whose payloads parties may also relay to each other (as XCLP's SecureHamming)."""

    relays = True

    def start(self) -> None:
        self.scope.start_step("blob")

    def accept(self, step: Step, sender: str, payload: wire.Payload) -> None:
        pass

    def on_step_complete(self, step: Step) -> None:
        self.done()


class BlobJob(CoordinatorJob):
    """A blob step, then the all-reduce job's phases: a job composed of phases."""

    def program(self, run):
        yield Blob(run.scope)
        return (yield from AllReduceJob(self.config).program(run))


PAILLIER = {"paillier_n": b"\x80" + bytes(62) + b"\x01", "paillier_hs": bytes(127) + b"\x02"}  # a 512-bit key's sizes



def committed(run: Run, attempt: int, party: str, seed: bytes) -> bytes:
    """A confirmation of the "sum" step whose commitment `seed` opens (the signature is the parties' to check)."""
    return Confirmation(bytes(32), commit_seed(run.session_id, "sum", attempt, party, seed), bytes(64)).pack()

def summary(dim=4, rows=3):
    return pb.DataSummary(rows=rows, labeled_rows=min(rows, 3), dim=dim)


def drain(job, party):
    items = []
    while (item := job.parties[party].mailbox.get(0)) is not None:
        items.append(item)
    return items


def msg(step, round, sender, payload, recipient=""):
    return wire.Message("j", step, round, sender, recipient, payload)


def started(keys, cls=AllReduceJob, parties=("a", "b", "c"), **kw):
    clock = Clock()
    config = job("j", "flynn", FLYNN, parties=parties, **kw)
    j = Run(config, allow_list(keys), clock=clock, job=cls(config))
    for p in parties:
        admit(j, keys, p, summary())
    return j, clock


def test_all_joined_sends_roster_then_seed_step(keys):
    j, _ = started(keys)
    assert j.stage is Stage.SETUP and j.step.name == "seed" and j.step.participants == ("a", "b", "c")
    items = drain(j, "b")
    assert [i.WhichOneof("item") for i in items] == ["status", "roster", "step"]  # b heard that c was missing
    assert [identity.KeyBundle.from_bytes(b.bundle).party_id for b in items[1].roster.bundles] == ["a", "b", "c"]
    assert [i.WhichOneof("item") for i in drain(j, "c")] == ["roster", "step"]  # c completed the set


def test_waiting_parties_hear_who_joined_and_when_the_join_deadline_is(keys):
    clock = Clock()
    j = Run(job("j", "flynn", FLYNN, join_seconds=600), allow_list(keys), clock=clock)
    admit(j, keys, "a", summary())
    (first,) = drain(j, "a")
    assert (first.status.joined, first.status.expected, first.status.min_parties) == (1, 3, 2)
    assert list(first.status.waiting_for) == ["b", "c"] and first.status.join_deadline_seconds == 600
    j.tick(59.0)
    assert drain(j, "a") == []  # nothing new before a minute has passed
    j.tick(60.0)
    (again,) = drain(j, "a")
    assert again.status.join_deadline_seconds == 540 and list(again.status.waiting_for) == ["b", "c"]
    admit(j, keys, "c", summary())
    assert [list(i.status.waiting_for) for i in drain(j, "a")] == [["b"]]


def test_join_deadline_starts_with_enough_parties_or_fails(keys):
    clock = Clock()
    j = Run(job("j", "flynn", FLYNN, join_seconds=10), allow_list(keys), clock=clock)
    admit(j, keys, "a", summary())
    admit(j, keys, "c", summary())
    j.tick(9.9)
    assert j.stage is Stage.JOINING
    j.tick(10.0)
    assert j.stage is Stage.SETUP and j.active == ["a", "c"] and j.dropped == {"b"}
    lonely = Run(job("j", "flynn", FLYNN, join_seconds=10), allow_list(keys), clock=clock)
    admit(lonely, keys, "a", summary())
    lonely.tick(10.0)
    assert lonely.stage is Stage.FAILED and "only 1" in lonely.outcome_reason
    assert drain(lonely, "a")[-1].end.outcome == pb.JobEnd.FAILED


def test_a_decline_names_an_expected_party_and_this_run_and_comes_before_its_join(keys):
    """Decline (a verified call) is taken only from an expected party that has not joined, for
    this run's nonce and a known reason; then nobody waits for that party."""
    budget = pb.DeclineRequest.PRIVACY_BUDGET
    j = Run(job("j", "flynn", FLYNN, join_seconds=600), allow_list(keys), clock=Clock())
    admit(j, keys, "a", summary())
    with pytest.raises(NotAuthorized, match="'mallory' is not expected"):
        j.decline("mallory", j.run_nonce, budget)
    with pytest.raises(ProtocolError, match="names another run"):
        j.decline("b", bytes(16), budget)
    with pytest.raises(ProtocolError, match="'a' has joined"):
        j.decline("a", j.run_nonce, budget)
    with pytest.raises(InvalidInput, match="unknown reason"):
        j.decline("b", j.run_nonce, pb.DeclineRequest.REASON_UNSPECIFIED)
    j.decline("b", j.run_nonce, budget)
    assert list(drain(j, "a")[-1].status.waiting_for) == ["c"]
    admit(j, keys, "c", summary())
    assert j.stage is Stage.SETUP and j.active == ["a", "c"]  # at once, not at the join deadline
    assert j.summary()["dropped"] == {"b": "declined: its privacy budget for this data set is spent"}
    with pytest.raises(ProtocolError, match="past admission"):
        j.decline("b", j.run_nonce, budget)


def test_admission_checks_run_before_the_stage_check(keys):
    j, _ = started(keys)
    with pytest.raises(NotAuthorized):
        admit(j, keys, "mallory", summary())
    with pytest.raises(ProtocolError, match="past admission"):
        admit(j, keys, "a", summary())
    fresh = Run(job("j", "flynn", FLYNN), allow_list(keys))
    with pytest.raises(InvalidInput, match="job 'other'"):
        admit(fresh, keys, "a", summary(), job_id="other")


def test_large_relayed_payload_is_validated_chunked_and_delivered_intact(keys):
    j, _ = started(keys, cls=BlobJob)
    for p in "abc":
        drain(j, p)
    for p in "abc":
        j.message(p, msg("seed", 0, p, b""))
    assert j.step.name == "blob"
    blob = np.random.default_rng(0).integers(0, 2**63, size=3_000_000, dtype=np.uint64)  # 24 MB
    j.message("a", msg("blob", 0, "a", blob, recipient="c"))
    frames = [i.frame for i in drain(j, "c") if i.WhichOneof("item") == "frame"]
    assert len(frames) == 8 and all(f.ByteSize() < wire.GRPC_MAX_MESSAGE_BYTES for f in frames)
    assert all(f.sender == "a" and f.recipient == "c" for f in frames)
    asm = wire.Assembler()
    out = [asm.add(f) for f in frames][-1]
    assert np.array_equal(out.payload, blob)
    assert j.step.bytes_relayed == blob.nbytes
    with pytest.raises(InvalidInput, match="not another participant"):
        j.message("a", msg("blob", 0, "a", b"x", recipient="a"))
    with pytest.raises(InvalidInput, match="not another participant"):
        j.message("a", msg("blob", 0, "a", b"x", recipient="mallory"))


def test_contributions_are_checked_and_late_rounds_ignored(keys):
    j, clock = started(keys, step_seconds=5)
    for p in "abc":
        j.message(p, msg("seed", 0, p, b""))
    assert j.stage is Stage.RUNNING and j.step.name == "sum"
    good = np.zeros((2, 8), np.uint32)
    with pytest.raises(InvalidInput, match="must be <u4"):
        j.message("a", msg("sum", 0, "a", np.zeros((2, 9), np.uint32)))
    with pytest.raises(InvalidInput, match="step 'blob' is not running"):
        j.message("a", msg("blob", 0, "a", b""))
    j.message("a", msg("seed", 0, "a", b""))  # late payload for a step that is over: ignored
    assert j.step.name == "sum" and j.step.pending == {"a", "b", "c"}
    j.message("a", msg("sum", 0, "a", good))
    with pytest.raises(InvalidInput, match="already contributed"):
        j.message("a", msg("sum", 0, "a", good))
    with pytest.raises(InvalidInput, match="not started"):
        j.message("b", msg("sum", 1, "b", good))
    with pytest.raises(InvalidInput, match="a sealed self-mask share is 94 opaque bytes"):  # the only relay here
        j.message("b", msg("sum", 0, "b", good, recipient="c"))
    clock.now = 5.0
    j.tick(clock.now)  # b and c missed the deadline: 1 party left < min_parties = 2
    assert j.stage is Stage.FAILED and j.dropped == {"b", "c"}


def test_dropout_restarts_the_sum_in_a_new_round_and_old_uploads_are_ignored(keys):
    j, _ = started(keys)
    for p in "abc":
        j.message(p, msg("seed", 0, p, b""))
    ones = np.ones((2, 8), np.uint32)
    j.message("a", msg("sum", 0, "a", ones))
    j.disconnected("c")
    assert j.step.attempt == 1 and j.step.participants == ("a", "b") and j.drop_reasons == {"c": "disconnected"}
    j.message("b", msg("sum", 0, "b", ones))  # late upload for round 0: ignored, not an error
    assert j.step.pending == {"a", "b"}
    with pytest.raises(ProtocolError, match="takes no part"):
        j.message("c", msg("sum", 1, "c", ones))
    seeds = {"a": bytes([1]) * 32, "b": bytes([2]) * 32}
    j.message("a", msg("sum", 1, "a", ones + self_mask(seeds["a"], ones.shape, ones.dtype)))
    j.message("b", msg("sum", 1, "b", 2 * ones + self_mask(seeds["b"], ones.shape, ones.dtype)))
    # docs/design.md §2.5, §6.1: complete, so both confirm their transcripts, then reveal their seeds of round 1
    assert j.stage is Stage.RUNNING
    assert (j.step.name, j.step.attempt, j.step.participants) == ("sum_confirm", 1, ("a", "b"))
    for p in "ab":
        j.message(p, msg("sum_confirm", 1, p, committed(j, 1, p, seeds[p])))
    assert (j.step.name, j.step.attempt, j.step.participants) == ("sum_reveal", 1, ("a", "b"))
    digest = reveal_digest(j.session_id, "sum", 1, ("a", "b"))
    with pytest.raises(InvalidInput, match="another session, attempt or participant set"):
        j.message("a", msg("sum_reveal", 1, "a", pack_reveal(reveal_digest(j.session_id, "sum", 0, "abc"), seeds["a"])))
    for p in "ab":
        j.message(p, msg("sum_reveal", 1, p, pack_reveal(digest, seeds[p])))
    assert j.stage is Stage.DONE
    frames = [i.frame for i in drain(j, "a") if i.WhichOneof("item") == "frame"]
    result = wire.Assembler().add(frames[-1])
    assert result.step == "result" and result.round == 1 and np.array_equal(result.payload, 3 * ones)
    assert drain(j, "c")[-1].end.outcome == pb.JobEnd.DROPPED


def test_a_party_lost_while_revealing_is_recovered_from_shares_never_by_another_attempt(keys):
    """The others revealed their seeds and mask no other attempt (docs/design.md §6.1): the lost seed is rebuilt."""
    j, _ = started(keys)
    for p in "abc":
        j.message(p, msg("seed", 0, p, b""))
    for p in "abc":
        j.message(p, msg("sum", 0, p, np.ones((2, 8), np.uint32)))
    for p in "abc":
        j.message(p, msg("sum_confirm", 0, p, committed(j, 0, p, bytes(32))))
    for p in "ab":
        j.message(p, msg("sum_reveal", 0, p, pack_reveal(reveal_digest(j.session_id, "sum", 0, "abc"), bytes(32))))
        if p == "a":
            j.disconnected("c")
    assert (j.step.name, j.step.attempt, j.step.participants) == ("sum_recover", 0, ("a", "b"))
    j.disconnected("b")  # a alone holds one share of c's seed (t = 2), and is alone in the job
    assert j.stage is Stage.FAILED and j.step is None


def test_only_the_leader_may_relay_the_seed(keys):
    j, _ = started(keys)
    with pytest.raises(ProtocolError, match="leader"):
        j.message("b", msg("seed", 0, "b", b"x" * 60, recipient="c"))
    j.message("a", msg("seed", 0, "a", b"x" * 60, recipient="c"))
    assert any(i.WhichOneof("item") == "frame" for i in drain(j, "c"))


def test_an_admitted_party_cannot_flood_a_peer_through_the_coordinator(keys, monkeypatch):
    """Attack (memory exhaustion): the leader's seed relay had no once-per-recipient limit and
    mailboxes were unbounded (320 MiB queued for one recipient, nothing refused)."""
    j, _ = started(keys)
    j.message("a", msg("seed", 0, "a", b"x" * 60, recipient="c"))
    for _ in range(3):
        with pytest.raises(ResourceExhausted, match="already sent its 'seed' message to 'c'"):
            j.message("a", msg("seed", 0, "a", b"x" * 60, recipient="c"))
    assert j.parties["c"].mailbox.queued_bytes == 60
    monkeypatch.setattr(mailbox_module, "MAILBOX_MAX_BYTES", 100)  # b's mailbox holds 0 of a 100-byte budget
    with pytest.raises(ResourceExhausted, match="will not queue more"):
        j.message("a", msg("seed", 0, "a", b"x" * 101, recipient="b"))
    drain(j, "c")
    assert j.parties["c"].mailbox.queued_bytes == 0


def test_a_party_with_more_rows_than_the_job_takes_is_refused_at_join(keys):
    from dataclasses import replace

    j = Run(replace(job("j", "flynn", FLYNN), max_rows_per_party=10), allow_list(keys), clock=Clock())
    with pytest.raises(InvalidInput, match="reports 11 rows; job 'j' takes at most 10 per party"):
        admit(j, keys, "a", summary(rows=11))
    admit(j, keys, "a", summary(rows=10))


def test_late_relay_for_a_finished_step_is_ignored_not_refused(keys):
    # A restarted step can complete from cached results while a party still resends its relay
    # for it; that push is late, not malformed, and must not cost the party its place.
    j, _ = started(keys, cls=BlobJob)
    for p in "abc":
        j.message(p, msg("seed", 0, p, b""))
    for p in "abc":
        j.message(p, msg("blob", 0, p, b""))
    assert j.step.name == "sum"
    for p in "abc":
        drain(j, p)
    j.message("a", msg("blob", 0, "a", b"late", recipient="c"))
    assert drain(j, "c") == [] and j.active == ["a", "b", "c"] and j.step.pending == {"a", "b", "c"}
    with pytest.raises(InvalidInput, match="step 'never' is not running"):
        j.message("a", msg("never", 0, "a", b"", recipient="c"))


def test_an_xclp_job_whose_k_exceeds_the_rows_is_refused_before_any_work(keys):
    """Found before: k >= n failed in labeled_sets, after all of SecureHamming, with exit 5."""
    params = {"n_classes": 3, "lsh_bits": 64, "k": 10, "key_bits": 512, "insecure_test_keys": True}
    j = Run(job("j", "xclp", params, parties=("a", "b")), allow_list(keys), clock=Clock())
    for p in ("a", "b"):
        admit(j, keys, p, summary(rows=5), **PAILLIER)
    assert j.stage is Stage.FAILED and j.step is None
    end = drain(j, "a")[-1].end
    assert end.outcome == pb.JobEnd.REFUSED
    assert "k = 10 neighbours need at least 11 rows in all, but the 2 parties bring 10" in end.reason


def test_a_flynn_party_whose_data_is_narrower_than_s_is_refused_at_join(keys):
    j = Run(job("j", "flynn", {**FLYNN, "s": 5}), allow_list(keys), clock=Clock())
    with pytest.raises(InvalidInput, match=r"cannot use data of 4 columns: s .* = 5 exceeds the data dimension 4"):
        admit(j, keys, "a", summary(dim=4))
    assert j.parties == {}


@pytest.mark.parametrize("job_type, params, refused", [
    ("flynn", FLYNN, True),
    ("race", {"rows": 4, "width": 4, "n_classes": 2}, True),
    ("race", {"rows": 4, "width": 4}, False),  # a density of every row: labels are not used
])
def test_a_count_job_that_learns_from_labels_is_refused_when_no_party_brings_one(keys, job_type, params, refused):
    j = Run(job("j", job_type, params, parties=("a", "b")), allow_list(keys), clock=Clock())
    for p in ("a", "b"):
        admit(j, keys, p, pb.DataSummary(rows=5, labeled_rows=0, dim=4))
    if not refused:
        assert j.stage is not Stage.FAILED
        return
    assert j.stage is Stage.FAILED and j.step is None
    end = drain(j, "a")[-1].end
    assert end.outcome == pb.JobEnd.REFUSED and "no party brought a labeled row" in end.reason


def test_a_bundle_of_another_spec_is_refused_and_unset_centres_say_how_to_run_with_older_parties(keys):
    """A party of a version from before unset XCLP centres followed the rows reads them as 64, so
    its bundle signs another spec: refused, and told what lets the run take it (centres in the job
    file); a job that sets its centres refuses another spec without that advice."""
    from tests.harness import key_bundle

    params = {"n_classes": 2, "key_bits": 512, "insecure_test_keys": True}
    for set_centres in (False, True):
        config = job("j", "xclp", {**params, "centres": 128} if set_centres else params)
        run = Run(config, allow_list(keys))
        older = job("j", "xclp", {**params, "centres": 64})  # the spec such a party signs
        bundle = key_bundle(keys["a"], "a", "j", spec=older.spec(), nonce=run.run_nonce, summary=summary(rows=5),
                            **PAILLIER)
        with pytest.raises(InvalidInput, match="signs another spec than job 'j' has") as refused:
            run.join(identity.sign_bundle(keys["a"], bundle), summary(rows=5))
        assert ("set centres in the job file" in str(refused.value)) is not set_centres
