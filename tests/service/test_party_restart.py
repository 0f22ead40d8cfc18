"""A party whose process is killed with SIGKILL in the middle of SecureHamming, and started again
with the same command, rejoins its run (docs/operating.md, "Resume"): it reads its sealed run state
back, the coordinator starts the next attempt with it, every pair goes on from its first piece not
folded, and every party's prediction is exactly the plaintext reference's.

Party a is a real `xclp-client run` process (small_pieces_client.py: many pieces per pair); b and c
run on threads against an in-process coordinator. b and c stop reading what a sends them after its
fourth message of the first attempt until a has been killed, so the kill lands with a's pairs
folded in part, whatever the machine's speed.
"""

from __future__ import annotations

import csv
import itertools
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from tests.harness import allow_list, coordinator, job, party_data, run_parties
from tests.helpers import save_identity, write_table
from tests.service.test_resume import wait_until, write_allow_list
from xclp import candidates as cd
from xclp.client.phases.secure_hamming import SecureHammingParty
from xclp.client.policy import PartyPolicy
from xclp.client.run_config import JobResult
from xclp.client.run_state import RUNS_DIR, RunStateFile
from xclp.crypto.paillier import PaillierKeypair
from xclp.crypto.secure_hamming import SlotLayout
from xclp.graph import GraphParams
from xclp.reference import xclp_reference
from xclp.server.phases.secure_hamming import SecureHamming
from xclp.v1 import secure_hamming_wire as shw

PARTIES = ("a", "b", "c")
XCLP = {"n_classes": 3, "k": 4, "lsh_bits": 64, "key_bits": 512, "insecure_test_keys": True}
N = 30


class KillableParty:
    """Party a as a real `xclp-client run` process (`program`: the interpreter and script to run it
    with, `extra`: its other options): its table, identity key and the allow-list written to
    `tmp_path`, then killed with SIGKILL and started again with the same command; its two
    processes' logs are a0.log and a1.log."""

    def __init__(self, tmp_path: Path, keys, data, job_id: str, program: list[str], extra: list[str]) -> None:
        write_table(tmp_path / "a.csv", data.X, data.y, data.ids)
        save_identity(keys["a"], tmp_path / "a.key")
        write_allow_list(tmp_path, keys)
        self.tmp = tmp_path
        self.command = [*program, "run", "--insecure", "--job", job_id, "--party", "a",
                        "--identity", str(tmp_path / "a.key"), "--peers", str(tmp_path / "allow.toml"),
                        "--data", str(tmp_path / "a.csv"), "--id-column", "row_id", *extra]
        self.logs = [open(tmp_path / f"a{i}.log", "w") for i in range(2)]
        self.process: subprocess.Popen | None = None

    def start(self, address: str, again: bool = False) -> None:
        self.process = subprocess.Popen([*self.command, "--coordinator", address], stderr=self.logs[int(again)])

    def kill(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)  # no goodbye, no finally
        assert self.process.wait(30) == -signal.SIGKILL

    def wait_until(self, condition, seconds: float, what: str) -> None:
        wait_until(condition, seconds, what, self.process, who="party a")

    def finish(self, release: threading.Event, others: threading.Thread) -> str:
        """Let the run go on (`release`), and wait for the restarted process to exit 0 and for the
        other parties' thread to end; what the restarted process logged, which says it rejoined."""
        release.set()
        assert self.process is not None
        code = self.process.wait(180)
        others.join(60)
        assert not others.is_alive()
        said = self.said()
        assert code == 0, said
        assert "restarted: rejoining run" in said, said
        return said

    def said(self, first: bool = False) -> str:
        """What the restarted process logged (`first`: the first one)."""
        return (self.tmp / f"a{0 if first else 1}.log").read_text()

    def close(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
        for log in self.logs:
            log.close()


def reference(datas, seed: bytes, params: dict):
    """The plaintext reference run on `seed`: on all pairs, or on the candidate schedule the same
    seed's centres, probes and budgets give (as tests/service/test_candidate_pairs.py builds it)."""
    parties = [(datas[p].X, datas[p].y) for p in PARTIES]
    if "centres" not in params:
        return xclp_reference(parties, seed, 3, 64, GraphParams(k=4))
    unit = {p: cd.unit_rows(datas[p].X) for p in PARTIES}
    centres = cd.initial_centres(seed, params["centres"], unit["a"].shape[1])
    probes = {p: cd.nearest_centres(unit[p], centres, params["probes"]) for p in PARTIES}
    pooled = np.sum([cd.probe_table(probes[p], params["centres"]) for p in PARTIES], axis=0)
    sizes = {p: datas[p].X.shape[0] for p in PARTIES}
    used, budgets, _ = cd.choose_probes(pooled, sizes, list(itertools.permutations(sizes, 2)),
                                        SlotLayout(512, 64).slots, 1.0, params["pair_budget"])
    mask = cd.candidate_mask({p: cd.centre_lists(probes[p], used, budgets[p]) for p in PARTIES}, sizes)
    return xclp_reference(parties, seed, 3, 64, GraphParams(k=4), candidates=mask)


def hold_a_mid_securehamming(monkeypatch) -> threading.Event:
    """b and c: a's fifth message of the first attempt waits for the event (set once a is killed),
    so that the kill lands with a's pairs folded in part, whatever the machine's speed."""
    killed = threading.Event()
    heard: dict[str, int] = {"b": 0, "c": 0}
    real = SecureHammingParty.on_message

    def holds_on(self, message):
        me = self.ctx.party_id
        if message.sender == "a" and message.round == 0 and me in heard:
            heard[me] += 1
            if heard[me] == 5:
                killed.wait(120)
        return real(self, message)

    monkeypatch.setattr(SecureHammingParty, "on_message", holds_on)
    return killed


def mid_pair(coord, state: RunStateFile) -> bool:
    """a's state is saved, and a pair of a's has pieces folded on the coordinator."""
    run = coord.jobs.get("x")
    phase = run.phase if run is not None else None
    return state.path.exists() and isinstance(phase, SecureHamming) and any(
        s.folded > 0 and "a" in (s.task.a, s.task.b) for s in phase.streams.values())


def assert_predictions_of_a(path: Path, datas, ref) -> None:
    """a's predictions file: the reference's label on each of a's unlabeled rows."""
    with open(path, newline="") as f:
        rows = {r["row_id"]: r for r in csv.DictReader(f)}
    expected = ref.scores[ref.party_rows(0)].argmax(axis=1)
    unlabeled = np.flatnonzero(datas["a"].y == -1)
    assert [int(rows[datas["a"].ids[i]]["label"]) for i in unlabeled] == expected[unlabeled].tolist(), rows


@pytest.mark.slow
@pytest.mark.parametrize("params, rows", [({}, N), ({"pair_budget": 0.9, "centres": 4, "probes": 1}, 4 * N)],
                         ids=["all-pairs", "candidate-pairs"])
def test_a_party_killed_mid_securehamming_and_started_again_rejoins_its_run(keys, tmp_path: Path, monkeypatch,
                                                                             params, rows) -> None:
    """candidate-pairs: the restarted party reads back the opened probe table and recomputes its
    centre lists and schedules from it."""
    monkeypatch.setattr(shw, "PIECE_BYTES", 2 * 128)  # as party a's (small_pieces_client.py)
    datas = {p: party_data(70 + i, n=rows) for i, p in enumerate(PARTIES)}
    party = KillableParty(tmp_path, keys, datas["a"], "x",
                          [sys.executable, str(Path(__file__).with_name("small_pieces_client.py"))],
                          ["--out", str(tmp_path / "out.csv"), "--paillier-bits", "512", "--insecure-test-keys",
                           "--workers", "0", "--min-parties", "3", "--state", str(tmp_path / "state")])
    paillier = {p: PaillierKeypair.generate(512, allow_insecure_test_size=True) for p in "bc"}

    killed = hold_a_mid_securehamming(monkeypatch)
    config = job("x", "xclp", XCLP | params, min_parties=3, step_seconds=120, reconnect_seconds=60)
    state = RunStateFile(tmp_path / "state", "a", "x", keys["a"])
    outcome: dict[str, dict] = {}
    progress: dict[str, list[str]] = {}
    with coordinator(allow_list(keys), [config]) as (coord, address):
        party.start(address)
        others = threading.Thread(target=lambda: outcome.update(results=run_parties(
            address, "x", keys, {p: datas[p] for p in "bc"}, paillier=paillier, progress=progress,
            policy=PartyPolicy(min_parties=3, insecure_test_keys=True))), daemon=True)
        try:
            others.start()

            party.wait_until(lambda: mid_pair(coord, state), 120, "a's pairs to have pieces folded")
            saved = state.load()
            assert saved is not None and saved.meta["run_id"]
            assert (state.path.stat().st_mode & 0o777) == 0o600
            party.kill()
            assert state.path.exists()  # what the same command rejoins with
            party.start(address, again=True)
            said = party.finish(killed, others)
        finally:
            killed.set()
            party.close()
    assert "generating a 512-bit Paillier key" in party.said(first=True)
    assert "Paillier key" not in said  # it rejoins with the key it had, and makes none (it used to)
    assert "pieces of others kept from before" in said, said
    assert "s since this process rejoined the run)" in said and "since the seed" not in said, said  # not the seed's
    assert not state.path.exists()  # deleted once the run was past SecureHamming
    assert not os.listdir(tmp_path / "state" / RUNS_DIR)
    results = outcome["results"]
    assert all(isinstance(results[p], JobResult) for p in "bc"), results
    ref = reference(datas, results["b"].seed, params)  # type: ignore[union-attr]
    for j, p in enumerate(PARTIES[1:], start=1):
        unlabeled = datas[p].y == -1
        got = results[p].aggregate[unlabeled]  # type: ignore[union-attr]
        np.testing.assert_allclose(got, ref.scores[ref.party_rows(j)][unlabeled], rtol=0, atol=1e-6)
    assert_predictions_of_a(tmp_path / "out.csv", datas, ref)  # from the restarted process


@pytest.mark.slow
def test_a_party_killed_in_securerowsums_and_started_again_rejoins_the_sum(keys, tmp_path: Path,
                                                                           monkeypatch) -> None:
    """a's process is killed once its Z̄ is whole and SecureRowSums has started (b and c hold their
    masked row sums until then); started again, it reads back its graph layout and Z̄ (no influence
    column is sent again), the sum starts its next attempt among the same three, and every party's
    scores are exactly the reference's. Before, a was dropped ("which a party cannot rejoin") and b
    and c finished without it."""
    from xclp.client.jobs.xclp import XclpParty
    from xclp.v1.xclp import ROWSUMS_STEP

    datas = {p: party_data(50 + i, n=N) for i, p in enumerate(PARTIES)}
    party = KillableParty(tmp_path, keys, datas["a"], "x", [sys.executable, "-m", "xclp.client.cli"],
                          ["--out", str(tmp_path / "out.csv"), "--paillier-bits", "512", "--insecure-test-keys",
                           "--workers", "0", "--min-parties", "3", "--state", str(tmp_path / "state")])
    paillier = {p: PaillierKeypair.generate(512, allow_insecure_test_size=True) for p in "bc"}
    killed, held = threading.Event(), threading.Semaphore(0)
    real = XclpParty._encoded_row_sums

    def holds_on(self, members):  # b's and c's first masked row sums: after a is killed
        if not killed.is_set():
            held.release()
            killed.wait(120)
        return real(self, members)

    monkeypatch.setattr(XclpParty, "_encoded_row_sums", holds_on)
    config = job("x", "xclp", XCLP, min_parties=3, step_seconds=120, reconnect_seconds=60)
    state = RunStateFile(tmp_path / "state", "a", "x", keys["a"])
    outcome: dict[str, dict] = {}
    with coordinator(allow_list(keys), [config]) as (coord, address):
        party.start(address)
        others = threading.Thread(target=lambda: outcome.update(results=run_parties(
            address, "x", keys, {p: datas[p] for p in "bc"}, paillier=paillier,
            policy=PartyPolicy(min_parties=3, insecure_test_keys=True))), daemon=True)
        try:
            others.start()
            for _ in "bc":
                assert held.acquire(timeout=120), "b and c to start SecureRowSums"

            def in_sum() -> bool:
                saved = state.load()
                return saved is not None and "graph" in saved.meta["job"]

            party.wait_until(in_sum, 60, "a's run state with its Z̄")
            assert coord.jobs["x"].step.name == ROWSUMS_STEP
            party.kill()
            party.start(address, again=True)
            said = party.finish(killed, others)
        finally:
            killed.set()
            party.close()
        run = coord.jobs["x"]
    assert not run.dropped, run.drop_reasons
    assert run.ledger.steps[ROWSUMS_STEP].rounds >= 2  # attempt 0, and the one a rejoined
    assert "influence columns received" not in said  # Z̄ read back, not received again
    assert not os.listdir(tmp_path / "state" / RUNS_DIR)  # deleted once a revealed
    results = outcome["results"]
    assert all(isinstance(results[p], JobResult) for p in "bc"), results
    ref = reference(datas, results["b"].seed, {})  # type: ignore[union-attr]
    for j, p in enumerate(PARTIES[1:], start=1):
        unlabeled = datas[p].y == -1
        got = results[p].aggregate[unlabeled]  # type: ignore[union-attr]
        np.testing.assert_allclose(got, ref.scores[ref.party_rows(j)][unlabeled], rtol=0, atol=1e-6)
    assert_predictions_of_a(tmp_path / "out.csv", datas, ref)  # from the restarted process


def test_a_party_restarted_past_securehamming_is_dropped_and_the_others_go_on(keys, monkeypatch) -> None:
    """Only SecureHamming and update sums resume: a party whose process restarts in another step
    (here: as the labels step starts) is dropped at once, with why, rather than waited for; the run
    goes on."""
    from xclp.client.jobs.xclp import XclpParty
    from xclp.server import liveness
    from xclp.v1.xclp import LABELS_STEP

    allow = allow_list(keys)
    datas = {p: party_data(80 + i, n=N) for i, p in enumerate(PARTIES)}
    paillier = {p: PaillierKeypair.generate(512, allow_insecure_test_size=True) for p in PARTIES}
    real = XclpParty.on_step
    with coordinator(allow, [job("x", "xclp", XCLP, min_parties=2, step_seconds=60, reconnect_seconds=30)]) \
            as (coord, address):
        def restarts(self, step):  # a's process "restarts" as the labels step reaches it
            if self.party_id == "a" and step.step == LABELS_STEP:
                liveness.attach(coord.jobs["x"], "a", restarted=True)
            return real(self, step)

        monkeypatch.setattr(XclpParty, "on_step", restarts)
        results = run_parties(address, "x", keys, datas, paillier=paillier,
                              policy=PartyPolicy(min_parties=2, insecure_test_keys=True))
        run = coord.jobs["x"]
    assert "a" in run.dropped
    assert f"its process restarted in {LABELS_STEP!r}" in run.drop_reasons["a"], run.drop_reasons
    assert "only SecureHamming, update sums and SecureRowSums do" in run.drop_reasons["a"]
    assert all(isinstance(results[p], JobResult) for p in "bc"), results
    assert results["b"].participants == ("b", "c")  # type: ignore[union-attr]


def test_a_party_that_keeps_restarting_is_dropped_after_the_third_time(keys, monkeypatch) -> None:
    """Each restart costs every member the pieces in flight: the fourth restart of one party's
    process in one run drops it, with why, and the others finish without it (before, a party that
    crashed in a loop, or restarted on purpose, held the run in SecureHamming for good)."""
    from xclp.server import liveness

    allow = allow_list(keys)
    datas = {p: party_data(90 + i, n=N) for i, p in enumerate(PARTIES)}
    paillier = {p: PaillierKeypair.generate(512, allow_insecure_test_size=True) for p in PARTIES}
    real = SecureHammingParty.start
    with coordinator(allow, [job("x", "xclp", XCLP, min_parties=2, step_seconds=60, reconnect_seconds=30)]) \
            as (coord, address):
        def restarts(self, attempt, members):  # a "restarts" four times as its first attempt starts
            if self.ctx.party_id == "a" and attempt == 0:
                for _ in range(liveness.MAX_RESTARTS + 1):
                    liveness.attach(coord.jobs["x"], "a", restarted=True)
            return real(self, attempt, members)

        monkeypatch.setattr(SecureHammingParty, "start", restarts)
        results = run_parties(address, "x", keys, datas, paillier=paillier,
                              policy=PartyPolicy(min_parties=2, insecure_test_keys=True))
        run = coord.jobs["x"]
    assert run.drop_reasons.get("a") == "its process restarted 4 times in the run (at most 3)", run.drop_reasons
    assert all(isinstance(results[p], JobResult) for p in "bc"), results
    assert results["b"].participants == ("b", "c")  # type: ignore[union-attr]


@pytest.mark.slow
def test_an_agent_killed_mid_securehamming_and_started_again_rejoins_the_run_it_was_in(keys, tmp_path: Path,
                                                                                       monkeypatch) -> None:
    """The same for `xclp-client agent` (a's always-on party, a real process): killed with SIGKILL
    in SecureHamming and started again with the same configuration, it is offered the run back
    (Offer.rejoin: its place is kept for reconnect_seconds), finds its saved state and rejoins; its
    predictions, written by the restarted agent, are the reference's. Before, a restarted agent
    was never offered a run it had joined, and the coordinator dropped it after reconnect_seconds."""
    from dataclasses import replace

    monkeypatch.setattr(shw, "PIECE_BYTES", 2 * 128)  # as party a's (small_pieces_client.py)
    datas = {p: party_data(110 + i, n=N) for i, p in enumerate(PARTIES)}
    write_table(tmp_path / "a.csv", datas["a"].X, datas["a"].y, datas["a"].ids)
    save_identity(keys["a"], tmp_path / "a.key")
    write_allow_list(tmp_path, keys)
    paillier = {p: PaillierKeypair.generate(512, allow_insecure_test_size=True) for p in "bc"}
    killed = hold_a_mid_securehamming(monkeypatch)
    config = replace(job("x", "xclp", XCLP, min_parties=3, step_seconds=120, reconnect_seconds=60),
                     datasets=dict.fromkeys(PARTIES, "demo"))
    state = RunStateFile(tmp_path / "state", "a", "x", keys["a"])
    outcome: dict[str, dict] = {}
    logs = [open(tmp_path / f"agent{i}.log", "w") for i in range(2)]
    agent: subprocess.Popen | None = None
    with coordinator(allow_list(keys), [config]) as (coord, address):
        (tmp_path / "agent.toml").write_text(
            f'party = "a"\nidentity = "a.key"\npeers = "allow.toml"\ncoordinator = "{address}"\ninsecure = true\n'
            'out = "out"\nstate = "state"\npoll_seconds = 0.2\nworkers = 0\n[policy]\nmin_parties = 3\n'
            'insecure_test_keys = true\njob_types = ["xclp"]\n[datasets.demo]\npath = "a.csv"\nid_column = "row_id"\n')
        command = [sys.executable, str(Path(__file__).with_name("small_pieces_client.py")), "agent", "--config",
                   str(tmp_path / "agent.toml"), "--runs", "1"]
        agent = subprocess.Popen(command, stderr=logs[0], cwd=tmp_path)
        others = threading.Thread(target=lambda: outcome.update(results=run_parties(
            address, "x", keys, {p: datas[p] for p in "bc"}, paillier=paillier,
            policy=PartyPolicy(min_parties=3, insecure_test_keys=True))), daemon=True)
        try:
            others.start()

            wait_until(lambda: mid_pair(coord, state), 120, "a's pairs to have pieces folded", agent, who="a's agent")
            agent.send_signal(signal.SIGKILL)
            assert agent.wait(30) == -signal.SIGKILL and state.path.exists()
            agent = subprocess.Popen(command, stderr=logs[1], cwd=tmp_path)
            wait_until(lambda: "rejoining run" in (tmp_path / "agent1.log").read_text(), 60,
                       "the restarted agent to rejoin", agent, who="a's agent")
            killed.set()
            code = agent.wait(180)
            others.join(60)
        finally:
            killed.set()
            if agent is not None and agent.poll() is None:
                agent.kill()
            for log in logs:
                log.close()
    said = (tmp_path / "agent1.log").read_text()
    assert code == 0, said
    run_id = coord.jobs["x"].run_id
    assert f"rejoining run {run_id} of job x (xclp)" in said and "restarted: rejoining run" in said, said
    assert "pieces of others kept from before" in said, said
    assert not state.path.exists() and not os.listdir(tmp_path / "state" / RUNS_DIR)
    results = outcome["results"]
    assert all(isinstance(results[p], JobResult) for p in "bc"), results
    assert results["b"].participants == PARTIES  # type: ignore[union-attr]
    ref = reference(datas, results["b"].seed, {})  # type: ignore[union-attr]
    assert_predictions_of_a(tmp_path / "out" / "x" / run_id / "predictions.csv", datas, ref)
