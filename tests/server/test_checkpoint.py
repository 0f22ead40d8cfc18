"""The checkpoint a coordinator writes during SecureHamming, read back as a restarted coordinator
does (server/resume.py): what goes on from it, and what is refused.

A run among a, b and c is held in SecureHamming (a, as A of its pair with c, waits after three
pieces), its checkpoint taken as the Saver does; then `restore` builds the run again as a new
process would. It starts the next attempt past any the parties can have seen, every pair from its
pieces folded. A bundle no longer on the allow-list, another spec, a tampered bundle or a file that
is not a checkpoint are refused; a coordinator that meets such a file at start marks the run
interrupted, as it did before there were checkpoints, and does not crash.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from tests.harness import allow_list, coordinator, party_data, run_parties
from xclp.candidates import centre_lists, membership
from xclp.checkpoint import FORMAT as checkpoint_format
from xclp.client.phases.secure_hamming import SecureHammingParty
from xclp.client.policy import PartyPolicy
from xclp.client.session import PartySession
from xclp.crypto import identity
from xclp.crypto.paillier import PaillierKeypair
from xclp.errors import InvalidInput, InvalidSignature, XclpError
from xclp.server import resume
from xclp.server.config import reread_job
from xclp.server.coordinator import Coordinator
from xclp.server.events import Stage
from xclp.server.phases.base import attempt_after_restart
from xclp.server.phases.secure_hamming import SecureHamming
from xclp.server.phases.xclp_state import CandidateRun, XclpState
from xclp.server.resume import Checkpoints, Saved, restore, snapshot
from xclp.server.store import StateStore
from xclp.v1 import secure_hamming_wire as shw
from xclp.v1 import wire
from xclp.v1 import xclp_pb2 as pb
from xclp.v1.xclp import PAIRS_FROM_MSG, XclpJobParams
from xclp.v1.xclp_layout import PairTask

PARTIES = ("a", "b", "c")
JOB = ('job_id = "x"\ntype = "xclp"\nexpected_parties = ["a", "b", "c"]\nmin_parties = 2\n'
       "[deadlines]\njoin_seconds = 60\nstep_seconds = 60\nreconnect_seconds = 30\n"
       '[params]\nn_classes = 3\nk = 4\nlsh_bits = 64\nkey_bits = 512\ninsecure_test_keys = true\n')


@pytest.fixture(autouse=True)
def small_pieces(monkeypatch):
    """Pieces of two 512-bit ciphertexts, many per pair (as when the checkpoint was taken)."""
    monkeypatch.setattr(shw, "PIECE_BYTES", 2 * 128)


@pytest.fixture(scope="module")
def held(keys, tmp_path_factory):
    """(the run's checkpoint, the job file, the allow-list) of a run held in SecureHamming."""
    tmp = tmp_path_factory.mktemp("held")
    (tmp / "x.toml").write_text(JOB)
    config = reread_job(JOB, str(tmp / "x.toml"))
    allow = allow_list(keys)
    release, holding = threading.Event(), threading.Event()
    real = SecureHammingParty._as_a

    def holds_on(self, pair, kind, index, body):
        if self.ctx.party_id == "a" and pair.task.b == "c" and index == 3 and self.attempt == 0:
            holding.set()
            release.wait(60)
        return real(self, pair, kind, index, body)

    mp = pytest.MonkeyPatch()
    mp.setattr(shw, "PIECE_BYTES", 2 * 128)
    mp.setattr(SecureHammingParty, "_as_a", holds_on)
    datas = {p: party_data(70 + i, n=30) for i, p in enumerate(PARTIES)}
    paillier = {p: PaillierKeypair.generate(512, allow_insecure_test_size=True) for p in PARTIES}
    try:
        with coordinator(allow, [config]) as (coord, address):
            parties = threading.Thread(target=run_parties, args=(address, "x", keys, datas), daemon=True,
                                       kwargs={"paillier": paillier,
                                               "policy": PartyPolicy(min_parties=2, insecure_test_keys=True)})
            parties.start()
            assert holding.wait(60)
            run = coord.jobs["x"]
            with run.lock:
                tokens = {pid: h for h, (r, pid) in coord._tokens.items() if r is run}
                saved = snapshot(run, tokens, (JOB, str(tmp / "x.toml")))
            release.set()
            parties.join(60)
    finally:
        release.set()
        mp.undo()
    assert saved is not None
    return Saved.from_bytes(saved.to_bytes()), config, allow, tmp


def test_a_checkpoint_goes_on_at_a_later_attempt_from_the_pieces_it_folded(held) -> None:
    saved, config, allow, _ = held
    folded = {int(i): f for i, f in saved.meta["job"]["hamming"]["folded"].items()}
    assert any(f > 0 for f in folded.values())  # the pair (a, c) at least
    assert set(saved.meta["parties"]) == set(PARTIES) and all(p["token"] for p in saved.meta["parties"].values())
    run, tokens = restore(saved, config, allow, clock=lambda: 0.0)
    assert sorted(tokens.values()) == list(PARTIES)
    assert run.stage is Stage.RUNNING and isinstance(run.phase, SecureHamming)
    phase = run.phase
    assert phase.attempt == attempt_after_restart(saved.meta["job"]["hamming"]["attempt"], len(PARTIES))
    assert run.step is not None and run.step.attempt == phase.attempt
    assert {i: s.first for i, s in phase.streams.items() if s.first} == {i: f for i, f in folded.items() if f}
    # every party hears where each pair starts (uint64 per pair), then the step, in the attempt
    for p in PARTIES:
        mailbox = run.parties[p].mailbox
        assert mailbox.renumber and run.parties[p].lost_at == 0.0
        items = [mailbox.get(0) for _ in range(3)]
        assert items[-1] is None or not items[-1].HasField("frame")
        frames = [i.frame for i in items if i is not None and i.HasField("frame")]
        [message] = [m for f in frames if (m := wire.Assembler().add(f)) is not None]
        assert (message.step, message.round) == (PAIRS_FROM_MSG, phase.attempt)
        np.testing.assert_array_equal(message.payload, [folded.get(i, 0) for i in range(len(run.job.xclp.pairs))])
    assert run.post.next_id > 1 << 32  # no message id a party may hold part of a message under


def test_a_checkpoint_whose_pairs_this_version_cuts_otherwise_is_refused(held, monkeypatch) -> None:
    saved, config, allow, _ = held
    monkeypatch.setattr(shw, "PIECE_BYTES", 4 << 20)  # one piece per pair ...
    job = saved.meta["job"]  # ... where the pairs do not say how they are cut (FINE_PIECES)
    state = {**job["state"], "pairs": [[a, b, 0] for a, b, _ in job["state"]["pairs"]]}
    meta = {**saved.meta, "job": {**job, "state": state}}
    with pytest.raises(InvalidInput, match="the checkpoint cuts pair . into .* pieces, this coordinator into 1"):
        restore(Saved(meta, saved.arrays), config, allow, clock=lambda: 0.0)


def test_the_restored_graph_keeps_every_candidate_folded_before(held) -> None:
    saved, config, allow, _ = held
    run, _ = restore(saved, config, allow, clock=lambda: 0.0)
    graph = run.phase.graph  # type: ignore[union-attr]
    for p, top in graph.tops.items():
        before = saved.arrays[f"graph.sim.{p}"]
        np.testing.assert_array_equal(top.sim, before)
        np.testing.assert_array_equal(top.idx, saved.arrays[f"graph.idx.{p}"])


def test_a_checkpoint_names_where_the_run_goes_on_and_an_unknown_point_is_refused(held) -> None:
    """The coordinator's XCLP checkpoint names its resume point ("hamming", "labels" or "graph") when it
    is written; a restarted coordinator goes on from the point named, never from which keys the
    file happens to hold (before: `"hamming" in meta`, then `"labels" in meta`, else the graph)."""
    saved, config, allow, _ = held
    assert saved.meta["job"]["resume"] == "hamming"
    meta = {**saved.meta, "job": {**saved.meta["job"], "resume": "influence"}}
    with pytest.raises(InvalidInput, match="a resume point this version does not have: 'influence'"):
        restore(Saved(meta, saved.arrays), config, allow, clock=lambda: 0.0)


def test_a_party_no_longer_allowed_or_another_spec_is_refused(held, keys) -> None:
    saved, config, allow, tmp = held
    stranger = identity.generate_identity()
    with pytest.raises(InvalidSignature):
        restore(saved, config, {**allow, "c": identity.public_bytes(stranger)}, clock=lambda: 0.0)
    with pytest.raises(XclpError, match="not on the coordinator's allow-list"):
        restore(saved, config, {p: k for p, k in allow.items() if p != "c"}, clock=lambda: 0.0)
    other = reread_job(JOB.replace("k = 4", "k = 5"), str(tmp / "x.toml"))
    with pytest.raises(InvalidInput, match="signs another spec"):
        restore(saved, other, allow, clock=lambda: 0.0)
    meta = {**saved.meta, "parties": {**saved.meta["parties"]}}
    c = dict(meta["parties"]["c"])
    c["signature"] = ("00" if not c["signature"].startswith("00") else "11") + c["signature"][2:]
    meta["parties"]["c"] = c
    with pytest.raises(InvalidSignature):
        restore(Saved(meta, saved.arrays), config, allow, clock=lambda: 0.0)


@pytest.mark.parametrize("data", [b"not a checkpoint", b"", b"PK\x03\x04 a zip cut short"])
def test_a_file_that_is_not_a_checkpoint_is_refused_with_a_reason(data, held) -> None:
    with pytest.raises(InvalidInput, match="not a readable checkpoint"):
        Saved.from_bytes(data)
    whole = held[0].to_bytes()
    with pytest.raises(InvalidInput, match="not a readable checkpoint"):
        Saved.from_bytes(whole[: len(whole) // 2])  # a file cut short (it is renamed in whole: a disk fault)


def test_another_format_is_refused(held) -> None:
    saved = held[0]
    with pytest.raises(InvalidInput, match="another format"):
        Saved.from_bytes(Saved({**saved.meta, "format": 99}, saved.arrays).to_bytes())


def test_a_coordinator_that_cannot_read_a_checkpoint_back_marks_the_run_interrupted(held, tmp_path: Path) -> None:
    saved, config, allow, _ = held
    store = StateStore(tmp_path / "state.db")
    store.define_job("x", "xclp", JOB, str(tmp_path / "x.toml"))
    for _ in range(2):
        run_id = store.create_run("x", b"")
        store.set_state(run_id, "running")
    checkpoints = Checkpoints(tmp_path / "runs")
    checkpoints.write("1", Saved({**saved.meta, "run_id": "1"}, saved.arrays), 0)
    (tmp_path / "runs" / "2.ckpt").write_bytes(b"\x00garbage")
    # the first: its parties' bundles under another allow-list; the second: not a checkpoint
    coord = Coordinator({p: k for p, k in allow.items() if p != "b"}, [], store=store, checkpoints=checkpoints)
    assert coord.runs == {}
    for run_id in ("1", "2"):
        record = store.run(run_id)
        assert record.state == "interrupted", record
        assert not checkpoints.path(run_id).exists()


def test_a_checkpoint_written_after_its_phase_ended_is_not_put_in_place(held, tmp_path: Path) -> None:
    """The Saver takes the generation with the snapshot under the run's lock; the phase's end
    removes the file and moves the generation on, so a write under way then is dropped."""
    saved = held[0]
    checkpoints = Checkpoints(tmp_path)
    generation = checkpoints.generation("7")
    checkpoints.remove("7")  # the phase ended while the snapshot was being written
    assert not checkpoints.write("7", saved, generation)
    assert not checkpoints.path("7").exists() and not list(tmp_path.iterdir())
    assert checkpoints.write("7", saved, checkpoints.generation("7"))
    assert checkpoints.path("7").stat().st_mode & 0o777 == 0o600


def started_on_the_checkpoint(held, tmp_path: Path) -> tuple[Coordinator, StateStore, Checkpoints, str]:
    """A coordinator started on a state whose running run has `held`'s checkpoint, as after a crash."""
    saved, config, allow, _ = held
    store = StateStore(tmp_path / "state.db")
    store.define_job("x", "xclp", JOB, saved.meta["definition"][1])
    run_id = store.create_run("x", b"")
    store.set_state(run_id, "running")
    checkpoints = Checkpoints(tmp_path / "runs")
    checkpoints.write(run_id, Saved({**saved.meta, "run_id": run_id}, saved.arrays), 0)
    return Coordinator(allow, [config], store=store, checkpoints=checkpoints), store, checkpoints, run_id


def test_a_coordinator_started_on_a_checkpoint_goes_on_and_saves_the_attempt_at_once(held, tmp_path: Path) -> None:
    """Should the restarted coordinator die too before its first checkpoint, the next one must still
    start an attempt past the one the parties heard from this one."""
    saved, config, allow, _ = held
    coord, store, checkpoints, run_id = started_on_the_checkpoint(held, tmp_path)
    assert list(coord.runs) == [run_id] and coord.jobs["x"] is coord.runs[run_id]  # no second run of x queued
    assert store.run(run_id).state == "running" and not store.runs(states=("queued",))
    again = checkpoints.read(run_id)
    assert again is not None
    went_on = attempt_after_restart(saved.meta["job"]["hamming"]["attempt"], len(PARTIES))
    assert again.meta["job"]["hamming"]["attempt"] == went_on == coord.runs[run_id].step.attempt
    later, _ = restore(again, config, allow, clock=lambda: 0.0)
    assert later.step is not None and later.step.attempt == attempt_after_restart(went_on, len(PARTIES))


def test_a_dropout_takes_the_checkpoint_down_before_the_next_attempt_goes_out(held, tmp_path: Path) -> None:
    """c is dropped; the next attempt, among a and b, goes out at once. A checkpoint taken before
    the drop, read back after a crash in the second before the Saver's next write, would restart the
    step with c in it, and a and b refuse any restart that does not strictly shrink their set: the
    run would fail where it can go on. So the drop removes the checkpoint (under the run's lock,
    with the drop), and the next one says a and b."""
    coord, _, checkpoints, run_id = started_on_the_checkpoint(held, tmp_path)
    run = coord.runs[run_id]
    before = checkpoints.read(run_id)
    assert before is not None and before.meta["active"] == list(PARTIES)
    with run.lock:
        run._drop({"c"}, "missed the step deadline")
        assert run.step is not None and run.step.participants == ("a", "b")  # its StepStart is queued
        left = checkpoints.read(run_id)
    assert left is None or "c" not in left.meta["active"], left.meta["active"]
    [(job, tokens, definition)] = coord._saveable()
    assert coord._saver is not None and coord._saver.save(job, tokens, definition)
    after = checkpoints.read(run_id)
    assert after is not None and after.meta["active"] == ["a", "b"] and after.meta["dropped"] == ["c"]
    assert after.meta["job"]["hamming"]["attempt"] == run.step.attempt


def test_a_candidate_schedule_is_read_back_whole() -> None:
    """On candidate pairs the checkpoint holds every party's budgets and centre lists (public sizes,
    and what the coordinator holds anyway); read back, the lists and the centre sets they give are
    the same, and so is every pair's schedule."""
    sizes = {"a": 7, "b": 5}
    parties = {p: SimpleNamespace(summary=pb.DataSummary(rows=n), bundle=SimpleNamespace(paillier_n=b"\x07"))
               for p, n in sizes.items()}
    params = XclpJobParams(n_classes=2, lsh_bits=64, key_bits=512, insecure_test_keys=True).for_rows(12)
    state = XclpState.of(params, parties, list(sizes), dim=3)  # type: ignore[arg-type]
    state.pairs = (PairTask("b", "a"),)
    rng = np.random.default_rng(5)
    state.own = {p: (rng.integers(0, n, size=(n, 2)), rng.integers(0, 64, size=(n, 2))) for p, n in sizes.items()}
    budgets = {"a": np.array([3, 0, 4, 2]), "b": np.array([2, 2, 0, 3])}
    run = state.candidates = CandidateRun(2, budgets, 0.375)
    for p, n in sizes.items():
        probes = np.stack([rng.permutation(4)[:2] for _ in range(n)])
        run.lists[p] = centre_lists(probes, 2, budgets[p])
        run.members[p] = membership(run.lists[p], n, 2)
    meta, arrays = state.saved()
    meta = json.loads(json.dumps(meta))  # as the file holds it
    back = XclpState.restored(params, parties, meta, arrays)  # type: ignore[arg-type]
    assert back.pairs == state.pairs and back.membership == state.membership and back.dim == 3
    for p in sizes:
        assert all(np.array_equal(x, y) for x, y in zip(back.own[p], state.own[p]))
        assert back.candidates is not None
        assert [x.tolist() for x in back.candidates.lists[p]] == [x.tolist() for x in run.lists[p]]
        np.testing.assert_array_equal(back.candidates.members[p], run.members[p])
        np.testing.assert_array_equal(back.candidates.budgets[p], budgets[p])
    assert (back.candidates.probes, back.candidates.fraction) == (2, 0.375)
    assert back.candidates.schedule("b", "a", 8).counts().tolist() == run.schedule("b", "a", 8).counts().tolist()


def test_a_checkpoint_that_cannot_be_written_is_said_once_and_the_run_goes_on(tmp_path: Path, monkeypatch,
                                                                               caplog) -> None:
    """A state directory it cannot write (here a file where the directory should be): the saver says
    so once per run, not every second, and keeps going for the others."""
    (tmp_path / "runs").write_text("not a directory")
    stop, calls = threading.Event(), []
    job = SimpleNamespace(run_id="4", config=SimpleNamespace(job_id="x"))

    def live():
        calls.append(1)
        if len(calls) == 5:
            stop.set()
        return [(job, {}, ("text", "source"))]

    def save(self, job, tokens, definition, *, force=False):
        Checkpoints(tmp_path / "runs").write(job.run_id, Saved({"format": checkpoint_format}, {}), 0)

    monkeypatch.setattr(resume, "POLL_SECONDS", 0.0)
    monkeypatch.setattr(resume.Saver, "save", save)
    with caplog.at_level("ERROR", logger="xclp.server"):
        resume.Saver(Checkpoints(tmp_path / "runs"), live, stop).run()
    assert len(calls) == 5
    said = [r for r in caplog.records if "its checkpoint cannot be written" in r.getMessage()]
    assert len(said) == 1 and "run 4" in said[0].getMessage()


def test_a_party_dropped_before_the_crash_stays_dropped_and_hears_so_if_it_comes_back(keys, tmp_path: Path,
                                                                                      monkeypatch) -> None:
    """d dies in SecureHamming; the checkpoint of the restart among a, b and c, read back, goes on
    among a, b and c only, and d's place holds its JobEnd (DROPPED, with the reason) for a d that
    reconnects: it is not left waiting for a run that no longer counts it."""
    from tests.service.test_hamming_restart import PARTIES as FOUR
    from tests.service.test_hamming_restart import XCLP as FOUR_PARAMS
    from tests.service.test_hamming_restart import hold_a_pair_until_d_is_dropped

    monkeypatch.setattr(shw, "PIECE_BYTES", 2 * 128)
    text = JOB.replace('["a", "b", "c"]', '["a", "b", "c", "d"]').replace(
        "reconnect_seconds = 30", "reconnect_seconds = 1")
    (tmp_path / "x.toml").write_text(text)
    config = reread_job(text, str(tmp_path / "x.toml"))
    assert config.params.k == FOUR_PARAMS["k"]
    taken: list[Saved] = []
    real_start = SecureHamming.start

    def start(self):
        real_start(self)
        if self.attempt == 1 and not taken:  # the restart among a, b and c, under the run's lock
            run = self.scope.run
            tokens = {pid: h for h, (r, pid) in run.events._tokens.items() if r is run}
            taken.append(snapshot(run, tokens, (text, str(tmp_path / "x.toml"))))

    monkeypatch.setattr(SecureHamming, "start", start)
    # d dies as its SecureHamming starts, and a pair among a, b and c waits at its second piece until
    # the coordinator has dropped d: the restart always finds a pair not folded (before, a, b and c
    # could fold them all in the second d took to be dropped, and the restart completed at once)
    hold_a_pair_until_d_is_dropped(monkeypatch)

    class DiesInSecureHamming(PartySession):
        def handle(self, item) -> None:
            if self.job is not None and self.job.hamming.meter is not None:
                raise KeyboardInterrupt("d's process dies")
            super().handle(item)

    datas = {p: party_data(80 + i, n=30) for i, p in enumerate(FOUR)}
    paillier = {p: PaillierKeypair.generate(512, allow_insecure_test_size=True) for p in FOUR}
    with coordinator(allow_list(keys), [config]) as (_, address):
        results = run_parties(address, "x", keys, datas, paillier=paillier, sessions={"d": DiesInSecureHamming},
                              policy=PartyPolicy(min_parties=2, insecure_test_keys=True))
    assert isinstance(results["d"], BaseException) and taken and taken[0] is not None
    run, _ = restore(taken[0], config, allow_list(keys), clock=lambda: 0.0)
    assert run.active == ["a", "b", "c"] and run.step is not None and run.step.participants == ("a", "b", "c")
    assert run.step.attempt == attempt_after_restart(1, 3)
    d = run.parties["d"]
    assert d.ended
    ends = [item for item in iter(lambda: d.mailbox.get(0), None) if item.HasField("end")]
    assert [(e.end.outcome, e.end.reason) for e in ends] == [
        (pb.JobEnd.DROPPED, "disconnected, and did not reconnect within 1 s")]


def test_a_restarted_coordinator_starts_past_the_attempts_that_restarted_parties_took(keys, tmp_path: Path,
                                                                                     monkeypatch) -> None:
    """A checkpoint taken as SecureHamming's attempt 0 starts; then a's process restarts as often
    as a run allows (each restart takes it back at the next attempt among the same parties), and
    the coordinator dies before its next write. Read back, the checkpoint starts past every
    attempt the parties saw: before, the saved attempt + 3 assumed each later attempt had lost a
    party, and the restarted coordinator started an attempt (3) the parties had already masked,
    which each would refuse ("a restart must have a later attempt"). Every party may restart so
    (attempt_after_restart), and one is enough to show it."""
    from xclp.server import liveness

    text = JOB
    (tmp_path / "x.toml").write_text(text)
    config = reread_job(text, str(tmp_path / "x.toml"))
    taken: list[Saved] = []
    started: list[int] = []
    real_start, real_party = SecureHamming.start, SecureHammingParty.start

    def start(self):
        real_start(self)
        started.append(self.attempt)
        if self.attempt == 0:  # as the Saver would, under the run's lock
            run = self.scope.run
            tokens = {pid: h for h, (r, pid) in run.events._tokens.items() if r is run}
            taken.append(snapshot(run, tokens, (text, str(tmp_path / "x.toml"))))

    def restarts(self, attempt, members):  # a's process "restarts" as often as a run allows, once it is in
        if attempt == 0 and self.ctx.party_id == "a":
            for _ in range(liveness.MAX_RESTARTS):
                liveness.attach(coordinator_run[0], "a", restarted=True)
        return real_party(self, attempt, members)

    monkeypatch.setattr(SecureHamming, "start", start)
    monkeypatch.setattr(SecureHammingParty, "start", restarts)
    datas = {p: party_data(60 + i, n=30) for i, p in enumerate(PARTIES)}
    paillier = {p: PaillierKeypair.generate(512, allow_insecure_test_size=True) for p in PARTIES}
    coordinator_run: list = []
    with coordinator(allow_list(keys), [config]) as (coord, address):
        coordinator_run.append(coord.jobs["x"])
        results = run_parties(address, "x", keys, datas, paillier=paillier,
                              policy=PartyPolicy(min_parties=2, insecure_test_keys=True))
    # a's process here did not restart: its stream, taken by the "new" one, closed, and it was dropped
    assert all(not isinstance(results[p], BaseException) for p in "bc"), results
    assert started[:liveness.MAX_RESTARTS + 1] == list(range(liveness.MAX_RESTARTS + 1))  # a restart, an attempt
    seen = max(started)
    run, _ = restore(taken[0], config, allow_list(keys), clock=lambda: 0.0)
    assert run.step is not None and run.step.attempt > seen, (run.step.attempt, seen)


def test_the_first_checkpoint_of_a_phase_is_written_at_once(tmp_path: Path, monkeypatch) -> None:
    """Within CHECKPOINT_SECONDS of the last write, a checkpoint of the same phase waits (only when
    due), but the first of a new phase (its predecessor's file removed since) is written at the
    next poll: before, a phase shorter than CHECKPOINT_SECONDS after a long one was never saved."""
    checkpoints = Checkpoints(tmp_path / "runs")
    job = SimpleNamespace(run_id="5", lock=threading.Lock(), stage=Stage.RUNNING, phase="hamming", n=0)
    monkeypatch.setattr(resume, "snapshot", lambda run, tokens, definition: Saved(
        {"format": checkpoint_format, "phase": run.phase, "n": run.n, "elapsed": 0}, {}))
    saver = resume.Saver(checkpoints, list, threading.Event())
    assert saver.save(job, {}, ("text", "source"))
    job.n = 1  # something changed, in the same phase: not due yet
    assert not saver.save(job, {}, ("text", "source"))
    checkpoints.remove("5")  # the phase ended (Run.checkpoint_stale); the next one began
    job.phase = "rowsums"
    assert saver.save(job, {}, ("text", "source"))
    assert checkpoints.read("5").meta["phase"] == "rowsums"  # type: ignore[union-attr]
    job.n = 2
    assert not saver.save(job, {}, ("text", "source"))  # and then it waits again
