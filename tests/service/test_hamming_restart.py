"""A dropout in SecureHamming costs the pieces in flight, not every pair ("a restart after
a dropout redoes every SecureHamming pair"; "SecureHamming redoes at most the pieces in flight").

d dies in the middle of SecureHamming, once the coordinator has folded at least one pair among
a, b and c whole (or, second test, folded a pair among them in part). The restart among a, b and c
keeps what was folded (the coordinator's graph keeps its candidates per source party): it skips
the pairs folded whole and goes on with the others from their first piece not folded; the graph
and every prediction are still exactly the plaintext reference's among a, b and c.
"""

from __future__ import annotations

import threading
from concurrent.futures import Executor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool

import numpy as np
import pytest

from tests.harness import allow_list, coordinator, job, party_data, run_parties
from xclp.client import before_join
from xclp.client import session as session_module
from xclp.client.phases.secure_hamming import SecureHammingParty
from xclp.client.policy import PartyPolicy
from xclp.client.run_config import JobResult
from xclp.client.session import PartySession
from xclp.client.steps import xclp as client_steps
from xclp.crypto.paillier import PaillierKeypair
from xclp.graph import GraphParams
from xclp.reference import xclp_reference
from xclp.server.phases.secure_hamming import SecureHamming
from xclp.v1 import secure_hamming_wire as shw
from xclp.v1 import xclp_pb2 as pb
from xclp.v1.xclp import FINE_PIECES, KEEPS_PAIRS, KEEPS_PIECES

XCLP = {"n_classes": 3, "k": 4, "lsh_bits": 64, "key_bits": 512, "insecure_test_keys": True}
PARTIES = ("a", "b", "c", "d")
N = 30


def run_with_d_dying(keys, dies: type[PartySession]):
    """a, b, c and d (d with the session `dies`) through a job among all four: (data, results, the
    run, each party's progress lines), once d has died and the others are done."""
    datas = {p: party_data(40 + i, n=N) for i, p in enumerate(PARTIES)}
    paillier = {p: PaillierKeypair.generate(512, allow_insecure_test_size=True) for p in PARTIES}
    progress: dict[str, list[str]] = {}
    with coordinator(allow_list(keys), [job("x", "xclp", XCLP, parties=PARTIES)]) as (coord, address):
        results = run_parties(address, "x", keys, datas, paillier=paillier, sessions={"d": dies},
                              policy=PartyPolicy(min_parties=2, insecure_test_keys=True), progress=progress)
    assert isinstance(results["d"], BaseException)
    assert all(isinstance(results[p], JobResult) for p in "abc"), results
    return datas, results, coord.jobs["x"], progress


def hold_a_pair_until_d_is_dropped(monkeypatch) -> None:
    """One pair among a, b and c (the first whose A gets its second piece of the first attempt)
    waits there until the coordinator has dropped d: the restart finds that pair folded in part,
    whatever the machine's speed."""
    dropped, holder, chosen = threading.Event(), [], threading.Lock()
    real_dropped, real_as_a = SecureHamming.on_dropped, SecureHammingParty._as_a

    def on_dropped(self, step, gone):
        dropped.set()
        return real_dropped(self, step, gone)

    def as_a(self, pair, kind, index, body):
        if self.attempt == 0 and index == 1 and "d" not in (pair.task.a, pair.task.b):
            with chosen:
                holder[:] = holder or [pair.task]
            if holder == [pair.task]:
                dropped.wait(30)
        return real_as_a(self, pair, kind, index, body)

    monkeypatch.setattr(SecureHamming, "on_dropped", on_dropped)
    monkeypatch.setattr(SecureHammingParty, "_as_a", as_a)


def exactly_the_reference_among_abc(datas, results, run) -> None:
    """The graph, and every unlabeled row's scores, of the plaintext reference among a, b and c."""
    seed = results["a"].seed
    ref = xclp_reference([(datas[p].X, datas[p].y) for p in "abc"], seed, 3, 64, GraphParams(k=4))
    W = run.job.xclp.W
    for name in ("indptr", "indices", "data"):
        np.testing.assert_array_equal(getattr(W, name), getattr(ref.influence.W, name))
    for j, p in enumerate("abc"):  # its unlabeled rows' scores (its labeled rows keep their labels)
        unlabeled = datas[p].y == -1
        got = results[p].aggregate[unlabeled]
        np.testing.assert_allclose(got, ref.scores[ref.party_rows(j)][unlabeled], rtol=0, atol=1e-6)


@pytest.mark.parametrize("capable", [True, False], ids=["keeps", "old-parties"])
def test_a_party_lost_mid_securehamming_leaves_the_pairs_folded_among_the_rest_folded(keys, monkeypatch, capable):
    """old-parties: parties of a version before this one (they do not say they can skip pairs):
    every pair among the rest runs again, as before, with the same result."""
    if not capable:
        monkeypatch.setattr(before_join, "KEEPS_PAIRS", "something-else")
        monkeypatch.setattr(before_join, "KEEPS_PIECES", "something-else-too")
    attempts: list[tuple[int, set[frozenset[str]], int]] = []  # per attempt: kept pairs, pairs to run
    phases: list[SecureHamming] = []
    real_start = SecureHamming.start

    def start(self):
        real_start(self)
        phases.append(self)
        kept = {frozenset((self.state.pairs[i].a, self.state.pairs[i].b)) for i, s in enumerate(self.state.pairs)
                if i not in self.streams and {s.a, s.b} <= set(self.state.membership.graph)}
        attempts.append((self.attempt, kept if self.attempt else set(), len(self.streams)))

    monkeypatch.setattr(SecureHamming, "start", start)

    class DiesOncePairsAreFolded(PartySession):
        def handle(self, item: pb.PullItem) -> None:
            if phases and any("d" not in pair for pair in phases[-1].graph.pairs):  # type: ignore[union-attr]
                raise KeyboardInterrupt("d's process dies")
            super().handle(item)

    datas, results, run, progress = run_with_d_dying(keys, DiesOncePairsAreFolded)
    assert all((KEEPS_PAIRS in run.parties[p].capabilities) == capable for p in PARTIES)
    assert run.summary()["dropped"] == {"d": "disconnected, and did not reconnect within 1 s"}  # its process died
    (first, _, all_pairs), (second, kept, redone) = attempts
    assert (first, second, all_pairs) == (0, 1, 6)
    said = [line for p in "abc" for line in progress[p] if "kept from before" in line]
    if capable:
        assert kept and all("d" not in pair for pair in kept)  # at least one pair among a, b, c kept ...
        assert redone == 3 - len(kept)  # ... and only the others run again
        assert len(said) == 3, progress["a"]
    else:
        assert not kept and redone == 3 and not said
    exactly_the_reference_among_abc(datas, results, run)


@pytest.mark.parametrize("capable", [True, False], ids=["keeps-pieces", "keeps-pairs-only"])
def test_a_party_lost_mid_securehamming_leaves_the_pieces_folded_among_the_rest_folded(keys, monkeypatch, capable):
    """d dies once a pair among a, b and c is folded in part: the restart goes on with that pair from
    its first piece not folded (a fresh mask seed for the rest), so the pieces redone are only those
    not folded; exactly the reference still. keeps-pairs-only: parties of the version before this
    one (they skip whole pairs only): such a pair starts again from its first piece."""
    monkeypatch.setattr(shw, "PIECE_BYTES", 2 * 128)  # two ciphertexts of a 512-bit key: many pieces per pair
    if not capable:
        monkeypatch.setattr(before_join, "KEEPS_PIECES", "something-else")
    phases: list[SecureHamming] = []
    at_death: dict[int, int] = {}  # pair position -> pieces folded when d died
    starts: list[dict[int, tuple[int, int]]] = []  # per attempt: pair position -> (first piece, pieces)
    real_start = SecureHamming.start

    def start(self):
        real_start(self)
        phases.append(self)
        starts.append({i: (s.first, len(s.pieces)) for i, s in self.streams.items()})

    monkeypatch.setattr(SecureHamming, "start", start)
    # (before, the pair could be folded whole in the second d took to be dropped, and the restart
    # kept it whole: the test failed 3 runs in 4)
    hold_a_pair_until_d_is_dropped(monkeypatch)

    def folded_in_part(phase: SecureHamming) -> dict[int, int]:
        return {i: s.folded for i, s in phase.streams.items() if "d" not in (s.task.a, s.task.b)}

    class DiesMidPair(PartySession):
        def handle(self, item: pb.PullItem) -> None:
            if phases and not at_death:
                now = folded_in_part(phases[-1])
                if any(0 < f < len(phases[-1].streams[i].pieces) for i, f in now.items()):
                    at_death.update(now)
                    raise KeyboardInterrupt("d's process dies")
            super().handle(item)

    datas, results, run, progress = run_with_d_dying(keys, DiesMidPair)
    assert all((KEEPS_PIECES in run.parties[p].capabilities) == capable for p in PARTIES)
    first, second = starts
    partial = {i for i, f in at_death.items() if 0 < f < first[i][1]}
    assert partial  # d died with a pair among a, b and c folded in part (pieces may have folded since)
    if capable:  # every pair goes on from where it was: at or after where it was when d died
        assert all(second[i][0] >= at_death[i] for i in second)
        assert all(second[i][0] > 0 for i in partial if i in second)
        assert sum(n - f for f, n in second.values()) < sum(n for i, (_, n) in first.items() if i in at_death)
        assert any("pieces of others kept from before" in line for line in progress["a"] + progress["b"])
    else:  # a pair not folded whole starts again from its first piece
        assert all(f == 0 for f, _ in second.values())
    exactly_the_reference_among_abc(datas, results, run)


@pytest.mark.parametrize("liar, d_dies", [("a", False), ("a", True), ("d", True)])
def test_a_pair_whose_t_unmasks_out_of_range_is_never_kept(keys, monkeypatch, liar, d_dies) -> None:
    """The liar, as A of a pair, sends t that does not unmask to distances for one piece (once). Its
    pair's later pieces are not folded and the pair is never kept across a restart. With nobody
    lost the run fails with the coordinator's reason. With d lost after the lie, the restart among
    a, b and c starts the liar's pair from its first piece (a tells the truth this time) and keeps
    the others' pieces: exactly the reference; and likewise when d lied, its pair leaving with it."""
    monkeypatch.setattr(shw, "PIECE_BYTES", 2 * 128)
    real = client_steps.decrypt_piece
    lied: list[int] = []
    current = threading.local()

    def decrypt(keypair, ciphertexts, count, executor=None):
        t = real(keypair, ciphertexts, count, executor)
        if getattr(current, "party", "") == liar and not lied:
            lied.append(count)
            return bytes(len(t) - 1) + b"\x7f"  # t = 127 where R was drawn: (t - R) mod N far above L
        return t

    monkeypatch.setattr(client_steps, "decrypt_piece", decrypt)
    monkeypatch.setattr("xclp.client.phases.secure_hamming.steps.decrypt_piece", decrypt)
    real_as_a = SecureHammingParty._as_a

    def as_a(self, pair, kind, index, body):
        current.party = self.ctx.party_id
        return real_as_a(self, pair, kind, index, body)

    monkeypatch.setattr(SecureHammingParty, "_as_a", as_a)
    phases: list[SecureHamming] = []
    real_start = SecureHamming.start

    def start(self):
        real_start(self)
        phases.append(self)

    monkeypatch.setattr(SecureHamming, "start", start)
    wrong: set[int] = set()  # the pairs whose piece did not unmask, when d died

    class DiesOnceItLied(PartySession):
        def handle(self, item: pb.PullItem) -> None:
            if d_dies and phases and phases[-1].errors and all(
                    s.folded > 0 for s in phases[-1].streams.values()):
                wrong.update(phases[-1].errors)
                raise KeyboardInterrupt("d's process dies")
            super().handle(item)

    if not d_dies:
        datas = {p: party_data(40 + i, n=N) for i, p in enumerate(PARTIES)}
        paillier = {p: PaillierKeypair.generate(512, allow_insecure_test_size=True) for p in PARTIES}
        with coordinator(allow_list(keys), [job("x", "xclp", XCLP, parties=PARTIES)]) as (coord, address):
            results = run_parties(address, "x", keys, datas, paillier=paillier,
                                  policy=PartyPolicy(min_parties=2, insecure_test_keys=True))
            run = coord.jobs["x"]
        assert lied and run.stage.value == "failed", run.outcome_reason
        assert "secure_hamming" in run.outcome_reason and "t or R is malformed" in run.outcome_reason
        assert all(isinstance(results[p], BaseException) for p in PARTIES)
        return
    datas, results, run, _ = run_with_d_dying(keys, DiesOnceItLied)
    assert lied and len(phases) == 2
    assert wrong and all((s.first > 0) == (i not in wrong) for i, s in phases[-1].streams.items())
    exactly_the_reference_among_abc(datas, results, run)


class HeldPool(Executor):
    """A party's Paillier pool on threads whose evaluation tasks (B's) wait, while `held` is set,
    until the party ends them (LocalPool.abandon's contract: the tasks fail at once); without that,
    they would fail after 60 s, as a real pool's tasks would run to their end and beyond."""

    def __init__(self, held: threading.Event) -> None:
        self._threads, self._max_workers, self.held = ThreadPoolExecutor(2), 2, held
        self.ended, self.waiting, self.abandoned = threading.Event(), 0, 0

    def submit(self, fn, /, *args, **kwargs):
        def task():
            if self.held.is_set() and fn.__module__.endswith("role_b"):
                self.waiting += 1
                self.ended.wait(60)
                raise BrokenProcessPool("the pool's workers were ended")
            return fn(*args, **kwargs)

        return self._threads.submit(task)

    def abandon(self) -> bool:
        if not self.waiting:
            return False
        self.abandoned += 1
        self.ended.set()
        return True

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        self.ended.set()
        self._threads.shutdown(wait=wait, cancel_futures=cancel_futures)


def test_work_in_flight_for_an_attempt_a_restart_made_useless_is_ended_not_finished(keys, monkeypatch) -> None:
    """Once d is lost, every evaluation of the first attempt waits (as a long one would); the
    restart's StepStart, seen on each party's stream while it waits, ends that work (the party's
    pool abandons it) and the party goes on with the next attempt at once. Before, a party finished
    each task of the dead attempt first (at 3 x 4 000 rows: both cores 16-34 s more per restart):
    here they would wait 60 s and then fail."""
    monkeypatch.setattr(shw, "PIECE_BYTES", 2 * 128)
    held = threading.Event()
    pools: list[HeldPool] = []

    def make_executor(spec):
        pools.append(HeldPool(held))
        return pools[-1]

    monkeypatch.setattr(session_module, "make_executor", make_executor)
    real_start = SecureHamming.start

    def start(self):
        if self.attempt > 0:
            held.clear()  # the next attempt's tasks run (before any party hears of it)
        real_start(self)

    monkeypatch.setattr(SecureHamming, "start", start)

    class DiesMidSecureHamming(PartySession):
        def handle(self, item: pb.PullItem) -> None:
            if self.job is not None and self.job.hamming.meter is not None and self.job.hamming.meter.done > 2:
                held.set()  # from now on the others' evaluations of this attempt wait
                raise KeyboardInterrupt("d's process dies")
            super().handle(item)

    datas, results, run, progress = run_with_d_dying(keys, DiesMidSecureHamming)
    assert sum(p.abandoned for p in pools) >= 1, [(p.waiting, p.abandoned) for p in pools]
    assert any("its work in flight ended, a later attempt began" in line for p in "abc" for line in progress[p])
    exactly_the_reference_among_abc(datas, results, run)


@pytest.mark.parametrize("capable", [True, False], ids=["fine-pieces", "old-parties"])
def test_pairs_are_cut_finely_only_among_parties_that_read_it(keys, monkeypatch, capable):
    """FINE_PIECES (a fault costs a piece, docs/jobs/xclp.md): among parties that all read it, the pairs message
    gives each pair its ciphertexts per piece, at least PIECES_PER_PAIR pieces a pair (here, with
    pieces of at least 2, 30 ciphertexts in 15 pieces), and both sides cut alike; with a party of
    the version before (old-parties), the message is the two columns it reads and the pieces are
    PIECE_BYTES' (here one a pair). Exactly the reference either way."""
    if not capable:
        monkeypatch.setattr(before_join, "FINE_PIECES", "something-else")
    monkeypatch.setattr(shw, "MIN_FINE_VALUES", 2)
    streams: list[dict[int, int]] = []
    real_start = SecureHamming.start

    def start(self):
        real_start(self)
        streams.append({i: len(s.pieces) for i, s in self.streams.items()})

    monkeypatch.setattr(SecureHamming, "start", start)
    datas = {p: party_data(40 + i, n=N) for i, p in enumerate(PARTIES)}
    paillier = {p: PaillierKeypair.generate(512, allow_insecure_test_size=True) for p in PARTIES}
    with coordinator(allow_list(keys), [job("x", "xclp", XCLP, parties=PARTIES)]) as (coord, address):
        results = run_parties(address, "x", keys, datas, paillier=paillier,
                              policy=PartyPolicy(min_parties=2, insecure_test_keys=True))
    assert all(isinstance(results[p], JobResult) for p in PARTIES), results
    run = coord.jobs["x"]
    assert all((FINE_PIECES in run.parties[p].capabilities) == capable for p in PARTIES)
    assert [t.piece_values for t in run.job.xclp.pairs] == [2 if capable else 0] * 6
    assert streams == [dict.fromkeys(range(6), 15 if capable else 1)]
    ref = xclp_reference([(datas[p].X, datas[p].y) for p in PARTIES], results["a"].seed, 3, 64, GraphParams(k=4))
    for name in ("indptr", "indices", "data"):
        np.testing.assert_array_equal(getattr(run.job.xclp.W, name), getattr(ref.influence.W, name))
    for j, p in enumerate(PARTIES):
        unlabeled = datas[p].y == -1
        np.testing.assert_allclose(results[p].aggregate[unlabeled], ref.scores[ref.party_rows(j)][unlabeled],
                                   rtol=0, atol=1e-6)
