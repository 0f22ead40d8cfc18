"""A coordinator killed with SIGKILL in the middle of SecureHamming and started again on the same
state goes on with the run (docs/operating.md, "Resume"): the parties reconnect with their backoff,
the pairs go on from the pieces its checkpoint had folded, and every prediction is exactly the
plaintext reference's.

The coordinator is a real `xclp-server serve` process (small_pieces_server.py: many pieces per
pair, a checkpoint as often as every 0.2 s); the parties run on threads. Party a, as A, holds on to
its pair with c (once it has decrypted three of its pieces) until the coordinator has been
killed, so the kill lands with that pair folded in part, whatever the machine's speed.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from tests.harness import allow_list, party_data, run_parties
from xclp.client.phases.secure_hamming import SecureHammingParty
from xclp.client.policy import PartyPolicy
from xclp.client.run_config import JobResult
from xclp.crypto import identity
from xclp.crypto.paillier import PaillierKeypair
from xclp.errors import InvalidInput
from xclp.graph import GraphParams
from xclp.reference import xclp_reference
from xclp.server.phases.base import attempt_after_restart
from xclp.server.resume import Saved
from xclp.v1 import secure_hamming_wire as shw

PARTIES = ("a", "b", "c")
XCLP = {"n_classes": 3, "k": 4, "lsh_bits": 64, "key_bits": 512, "insecure_test_keys": True}
N = 30


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(condition, seconds: float, what: str, process: subprocess.Popen | None = None,
               who: str = "the coordinator") -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if process is not None and process.poll() is not None:
            raise AssertionError(f"{who} exited ({process.returncode}) while waiting for {what}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {seconds:.0f} s waiting for {what}")
        time.sleep(0.05)


def write_allow_list(tmp_path: Path, keys) -> None:
    """The allow-list of the tests' parties as `allow.toml` in `tmp_path`, as both CLIs read it."""
    (tmp_path / "allow.toml").write_text("[parties]\n" + "".join(
        f'{p} = "{identity.public_key_text(keys[p])}"\n' for p in allow_list(keys)))


def saved(path: Path) -> Saved | None:
    try:
        return Saved.from_bytes(path.read_bytes())
    except (OSError, InvalidInput):  # not there yet
        return None


class KillableCoordinator:
    """A real `xclp-server serve` (small_pieces_server.py) for one job file on `tmp_path`'s state,
    to be killed with SIGKILL and started again on the same state and port; its two processes'
    logs are coordinator0.log and coordinator1.log."""

    def __init__(self, tmp_path: Path, keys, job_text: str, env: dict[str, str] | None = None) -> None:
        write_allow_list(tmp_path, keys)
        (tmp_path / "job.toml").write_text(job_text)
        self.tmp, self.port = tmp_path, free_port()
        self.command = [sys.executable, str(Path(__file__).with_name("small_pieces_server.py")), "serve",
                        "--listen", f"127.0.0.1:{self.port}", "--insecure", "--allow-list",
                        str(tmp_path / "allow.toml"), "--state", str(tmp_path / "state" / "state.db"),
                        "--admin-listen", "off", "--job", str(tmp_path / "job.toml"), "--exit-when-done"]
        self.logs = [open(tmp_path / f"coordinator{i}.log", "w") for i in range(2)]
        self.process = subprocess.Popen(self.command, stderr=self.logs[0], cwd=tmp_path, env=env)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def checkpoint(self) -> Saved | None:
        """The run's checkpoint as it is on disk now (None: none, or one being replaced)."""
        return saved(self.tmp / "state" / "runs" / "1.ckpt")

    def kill_once(self, condition, what: str, env: dict[str, str] | None = None,
                  sig: signal.Signals = signal.SIGKILL) -> Saved:
        """Once `condition(checkpoint)` holds, SIGKILL the coordinator (or stop it with `sig`) and start
        it again; the checkpoint it goes on from, once it has read it back."""
        wait_until(lambda: (got := self.checkpoint()) is not None and condition(got), 120, what, self.process)
        before = self.checkpoint()
        assert before is not None
        self.restart(sig, env)
        wait_until(lambda: "goes on from its checkpoint" in self.said(), 60,
                   "the restarted coordinator to read the checkpoint back", self.process)
        return before

    def restart(self, sig: signal.Signals, env: dict[str, str] | None = None) -> None:
        """Stop the coordinator with `sig` (SIGKILL: no goodbye, the parties see their connections
        drop) and start it again on the same state and port."""
        self.process.send_signal(sig)
        code = self.process.wait(30)
        assert code == -signal.SIGKILL if sig == signal.SIGKILL else code >= 0, code
        self.process = subprocess.Popen(self.command, stderr=self.logs[1], cwd=self.tmp, env=env)

    def crash_once(self, parties: threading.Thread, release: threading.Event, condition, what: str,
                   env: dict[str, str] | None = None, sig: signal.Signals = signal.SIGKILL) -> Saved:
        """Start `parties` (a thread running them), kill and start the coordinator again once
        `condition(checkpoint)` holds (`kill_once`), then set `release` and let the run finish: the
        parties' thread ends, and so does the coordinator, with 0. The checkpoint it went on from."""
        try:  # the parties dial for 10 s: on a loaded machine the coordinator can take longer to start
            wait_until(lambda: "listening on port" in (self.tmp / "coordinator0.log").read_text(), 120,
                       "the coordinator to listen", self.process)
            parties.start()
            before = self.kill_once(condition, what, env, sig)
            release.set()
            parties.join(180)
            assert not parties.is_alive()
            assert self.process.wait(60) == 0
        finally:
            release.set()
            self.close()
        return before

    def said(self) -> str:
        """What the restarted coordinator logged."""
        return (self.tmp / "coordinator1.log").read_text()

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        for log in self.logs:
            log.close()


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["killed", "stopped"])
def test_a_coordinator_killed_mid_securehamming_goes_on_from_its_checkpoint(keys, tmp_path: Path, monkeypatch,
                                                                             sig) -> None:
    """Killed, or stopped (SIGTERM: a service manager's restart), mid-SecureHamming: the restarted
    coordinator goes on from the checkpoint. Stopped, it writes the run's checkpoint as it stands
    and leaves the parties to reconnect (before, a stop interrupted the run and removed the
    checkpoint, so that a graceful restart lost what a crash kept)."""
    monkeypatch.setattr(shw, "PIECE_BYTES", 2 * 128)  # as the coordinator's (small_pieces_server.py)
    params = "".join(f"{k} = {str(v).lower() if isinstance(v, bool) else v}\n" for k, v in XCLP.items())
    server = KillableCoordinator(tmp_path, keys, (
        'job_id = "x"\ntype = "xclp"\nexpected_parties = ["a", "b", "c"]\nsummary = "summary.json"\n'
        "[deadlines]\njoin_seconds = 120\nstep_seconds = 120\nreconnect_seconds = 60\n"
        f"[params]\n{params}"))
    killed = threading.Event()
    real = SecureHammingParty._as_a

    def holds_on(self, pair, kind, index, body):  # a, as A of its pair with c: the kill lands mid-pair
        if self.ctx.party_id == "a" and pair.task.b == "c" and index == 3 and self.attempt == 0:
            killed.wait(120)
        return real(self, pair, kind, index, body)

    monkeypatch.setattr(SecureHammingParty, "_as_a", holds_on)
    datas = {p: party_data(60 + i, n=N) for i, p in enumerate(PARTIES)}
    paillier = {p: PaillierKeypair.generate(512, allow_insecure_test_size=True) for p in PARTIES}
    progress: dict[str, list[str]] = {}
    outcome: dict[str, dict] = {}
    parties = threading.Thread(target=lambda: outcome.update(results=run_parties(
        server.address, "x", keys, datas, paillier=paillier, progress=progress,
        policy=PartyPolicy(min_parties=3, insecure_test_keys=True))), daemon=True)
    def mid_pair(got) -> bool:  # the pair (a, c) has pieces folded, and not all: a holds the rest
        return any(f > 0 for f in got.meta["job"]["hamming"]["folded"].values())

    before = server.crash_once(parties, killed, mid_pair, "a checkpoint with pieces folded", sig=sig)
    results = outcome["results"]
    assert all(isinstance(results[p], JobResult) for p in PARTIES), results
    said = server.said()
    assert "run 1 goes on from its checkpoint" in said
    stopped = (tmp_path / "coordinator0.log").read_text()
    assert ("run 1 is saved, and goes on when the coordinator starts again on this state" in stopped) == \
        (sig == signal.SIGTERM), stopped
    folded = {int(i): f for i, f in before.meta["job"]["hamming"]["folded"].items()}
    attempt = attempt_after_restart(int(before.meta["job"]["hamming"]["attempt"]), len(PARTIES))
    assert f"step secure_hamming attempt {attempt} started" in said
    # the restarted coordinator kept at least what the checkpoint had folded, and said so
    kept = [line for line in said.splitlines() if f"SecureHamming attempt {attempt} keeps" in line]
    assert kept and sum(folded.values()) > 0, said
    assert any("pieces of others kept from before" in line for p in PARTIES for line in progress[p])
    assert sum("reconnected to the coordinator" in line for p in PARTIES for line in progress[p]) == len(PARTIES)
    assert not os.listdir(tmp_path / "state" / "runs")  # removed once SecureHamming was over
    seed = results["a"].seed  # type: ignore[union-attr]
    ref = xclp_reference([(datas[p].X, datas[p].y) for p in PARTIES], seed, 3, 64, GraphParams(k=4))
    for j, p in enumerate(PARTIES):
        unlabeled = datas[p].y == -1
        got = results[p].aggregate[unlabeled]  # type: ignore[union-attr]
        np.testing.assert_allclose(got, ref.scores[ref.party_rows(j)][unlabeled], rtol=0, atol=1e-6)
