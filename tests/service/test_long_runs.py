"""Long runs that survive (docs/operating.md "Long runs"): the coordinator's own long work
runs off the RPC threads and outside the run's lock.

At 54 000 rows the coordinator solved the influence block inside the Push handler of the party
whose labeled rows came last, holding the run's lock; that party's Push did not return, it timed
out and left, and the coordinator then waited, with the lock held, for the gone party to drain its
mailbox: a disconnect, a tick and a cancel all queued on the lock, and nothing moved until SIGKILL.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from tests.harness import PARTIES, allow_list, coordinator, job, party_data, run_parties
from xclp.client.policy import PartyPolicy
from xclp.client.run_config import JobResult
from xclp.crypto import identity
from xclp.crypto.paillier import PaillierKeypair
from xclp.graph import InfluenceSolver
from xclp.server import liveness
from xclp.server.admin_cli import format_run
from xclp.v1.steps import LEAVE_MSG
from xclp.v1.wire import Message

XCLP = {"n_classes": 3, "k": 4, "lsh_bits": 64, "key_bits": 512, "insecure_test_keys": True}
BOUND = 5.0  # seconds a call may take while the coordinator computes (it takes milliseconds)


def test_while_the_coordinator_solves_a_push_returns_and_a_party_lost_meanwhile_is_dropped(keys, monkeypatch):
    """In the middle of the influence solve (its first block), from other threads: a party's Push
    (a late payload of a step that is over, which the run reads and ignores) and d's leave.
    Both must return while the solve goes on; d is dropped there and then, gets nothing more, and
    SecureRowSums goes on among a, b and c, who get their labels. On the code before, the solve ran
    on the thread of the Push that completed the labeled sets, holding the run's lock: both calls
    waited for the whole solve (here they were still waiting after 5 s)."""
    parties = (*PARTIES, "d")
    returned: dict[str, bool] = {}
    real_solve = InfluenceSolver.solve

    def solve(self, cols):
        if not returned:
            run = coord.jobs["x"]
            calls = {
                "push": lambda: run.message("a", Message("x", "labeled_sets", 0, "a", "", np.zeros(1, np.int64))),
                "disconnect": lambda: run.message("d", Message("x", LEAVE_MSG, 0, "d", "", b"stopped")),
            }
            threads = {name: threading.Thread(target=call, daemon=True) for name, call in calls.items()}
            for t in threads.values():
                t.start()
            for name, t in threads.items():
                t.join(BOUND)
                returned[name] = not t.is_alive()
        return real_solve(self, cols)

    monkeypatch.setattr(InfluenceSolver, "solve", solve)
    paillier = {p: PaillierKeypair.generate(512, allow_insecure_test_size=True) for p in parties}
    with coordinator(allow_list(keys), [job("x", "xclp", XCLP, parties=parties)]) as (coord, address):
        results = run_parties(address, "x", keys, {p: party_data(80 + i, n=20) for i, p in enumerate(parties)},
                              paillier=paillier, policy=PartyPolicy(min_parties=2, insecure_test_keys=True))
        summary = coord.jobs["x"].summary()
    assert returned == {"push": True, "disconnect": True}
    assert all(isinstance(results[p], JobResult) for p in PARTIES), results
    assert not isinstance(results["d"], JobResult)
    assert summary["outcome"] == "done" and summary["dropped"] == {"d": "left the run (stopped)"}
    assert summary["label_parties"] == list(PARTIES)  # SecureRowSums went on without d


@pytest.mark.slow
def test_sigterm_stops_a_coordinator_in_the_middle_of_its_influence_solve(keys, tmp_path: Path) -> None:
    """A real `xclp-server serve` whose influence solve never ends gets SIGTERM there: it saves the
    run to go on at its next start (the solve is a step a run goes on from) and exits 0 at once;
    the parties, with no coordinator back within the job's reconnect_seconds, stop. On the code
    before, the solve held the run's lock and the shutdown waited for that lock: the coordinator
    never exited."""
    allow = allow_list(keys)
    (tmp_path / "allow.toml").write_text("[parties]\n" + "".join(
        f'{p} = "{identity.public_key_text(keys[p])}"\n' for p in allow))
    params = "".join(f"{k} = {str(v).lower() if isinstance(v, bool) else v}\n" for k, v in XCLP.items())
    (tmp_path / "x.toml").write_text(f'job_id = "x"\ntype = "xclp"\nexpected_parties = ["a", "b", "c"]\n'
                                     f'[deadlines]\njoin_seconds = 120\nstep_seconds = 120\nreconnect_seconds = 3\n'
                                     f'[params]\n{params}')
    server = subprocess.Popen([sys.executable, str(Path(__file__).with_name("slow_solve_server.py")), "serve",
                               "--listen", "127.0.0.1:0", "--insecure", "--allow-list", str(tmp_path / "allow.toml"),
                               "--state", str(tmp_path / "state.db"), "--port-file", str(tmp_path / "port"),
                               "--admin-listen", "off", "--job", str(tmp_path / "x.toml")],
                              stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    try:
        port = ""
        for _ in range(600):  # the port file, written once the coordinator listens
            port = (tmp_path / "port").read_text().strip() if (tmp_path / "port").exists() else ""
            if port or server.poll() is not None:
                break
            threading.Event().wait(0.1)
        assert port, server.stderr.read() if server.stderr else ""
        paillier = {p: PaillierKeypair.generate(512, allow_insecure_test_size=True) for p in PARTIES}
        outcome: dict[str, dict] = {}
        parties = threading.Thread(target=lambda: outcome.update(results=run_parties(
            f"127.0.0.1:{port}", "x", keys, {p: party_data(90 + i, n=20) for i, p in enumerate(PARTIES)},
            paillier=paillier, policy=PartyPolicy(min_parties=2, insecure_test_keys=True))), daemon=True)
        parties.start()
        said = []
        assert server.stderr is not None
        for line in server.stderr:  # until the coordinator is in its solve
            said.append(line)
            if "SOLVING" in line:
                break
        assert said and "SOLVING" in said[-1], "".join(said)
        server.send_signal(signal.SIGTERM)
        rest = server.communicate(timeout=60)[1]  # it exits at once (a second here); before, never
        code = server.returncode
        parties.join(60)
    finally:
        if server.poll() is None:
            server.kill()
    assert code == 0
    results = outcome["results"]
    assert all("cannot reach the coordinator" in str(results[p]) for p in PARTIES), results
    assert "run 1 is saved, and goes on when the coordinator starts again on this state" in "".join(said) + rest


FLYNN = {"n_classes": 3, "m": 64, "s": 3, "rho": 8}
STEP_SECONDS, WORK_SECONDS = 3.0, 8.0


@pytest.mark.parametrize("reports", [True, False], ids=["reporting", "silent"])
def test_a_party_at_long_work_is_kept_while_it_reports_and_dropped_once_silent(keys, monkeypatch,
                                                                             reports: bool) -> None:
    """step_seconds = 3 s; c spends 8 s on its FlyNN counts before it sends its masked array. At
    work, c reports that it is (client/heartbeat.py: every step_seconds / 4 while busy), so the
    coordinator keeps waiting and all three get the model. Without the reports (a party frozen, as
    far as the coordinator can tell) c is dropped after 3 s of silence, and a and b go on. On the
    code before, the deadline was a stopwatch: c was dropped at 3 s either way."""
    from xclp.client import session as session_module
    from xclp.client.jobs.allreduce import AllReduceParty

    real = AllReduceParty.local_array
    shown: list[str] = []  # `job show` while c works, once it says what c is doing

    def slow(self, members):
        if self.ctx.party_id == "c":  # its long local work
            done = time.monotonic() + WORK_SECONDS
            while time.monotonic() < done:
                line = format_run(coord.run_info(coord.jobs["f"].run_id))
                if not shown and "(working on sum for " in line:
                    shown.append(line)
                threading.Event().wait(0.25)
        return real(self, members)

    monkeypatch.setattr(AllReduceParty, "local_array", slow)
    if not reports:
        class Mute(session_module.Heartbeat):
            def _loop(self) -> None:
                self._stop.wait()

        monkeypatch.setattr(session_module, "Heartbeat", Mute)
    with coordinator(allow_list(keys), [job("f", "flynn", FLYNN, step_seconds=STEP_SECONDS)]) as (coord, address):
        results = run_parties(address, "f", keys, {p: party_data(70 + i) for i, p in enumerate(PARTIES)},
                              policy=PartyPolicy(min_parties=2, insecure_test_keys=True))
        summary = coord.jobs["f"].summary()
    assert summary["outcome"] == "done"
    if reports:
        assert all(isinstance(results[p], JobResult) for p in PARTIES), results
        assert summary["dropped"] == {}
        (c_line,) = [x for x in shown[0].splitlines() if x.strip().startswith("c ")]
        assert "heard " in c_line and " s ago (working on sum for " in c_line, shown
    else:
        assert all(isinstance(results[p], JobResult) for p in "ab") and not isinstance(results["c"], JobResult)
        assert summary["dropped"] == {"c": "sent nothing for 3 s in step 'sum', which waited"}


def test_a_party_waiting_out_a_long_coordinator_solve_hears_the_run_is_alive_and_stays(keys, monkeypatch):
    """At 54 000 rows the influence solve takes many minutes and the parties hear nothing in that
    time: past their idle timeout (default 900 s) they gave up on a healthy run. The coordinator
    now sends each party a RunAlive every NEWS_SECONDS. Scaled down: a 4 s solve, news every 0.3 s,
    parties that give up after 1.5 s without news. On the code before, all three left in the solve."""
    monkeypatch.setattr(liveness, "NEWS_SECONDS", 0.3)
    real_solve = InfluenceSolver.solve
    solved = threading.Event()

    def solve(self, cols):
        if not solved.is_set():
            solved.set()
            threading.Event().wait(4.0)  # the coordinator's long computation
        return real_solve(self, cols)

    monkeypatch.setattr(InfluenceSolver, "solve", solve)
    paillier = {p: PaillierKeypair.generate(512, allow_insecure_test_size=True) for p in PARTIES}
    with coordinator(allow_list(keys), [job("x", "xclp", XCLP)]) as (coord, address):
        results = run_parties(address, "x", keys, {p: party_data(70 + i, n=20) for i, p in enumerate(PARTIES)},
                              paillier=paillier, policy=PartyPolicy(min_parties=2, insecure_test_keys=True),
                              overrides={p: {"idle_seconds": 1.5} for p in PARTIES})
        summary = coord.jobs["x"].summary()
    assert solved.is_set()
    assert all(isinstance(results[p], JobResult) for p in PARTIES), results
    assert summary["outcome"] == "done" and not summary["dropped"]
