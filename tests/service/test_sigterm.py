"""A party or an agent stopped by SIGTERM leaves no process behind, at once (item 5).

`kill -TERM` of an `xclp-client run` in SecureHamming used to leave its forkserver, resource
tracker and pool workers alive under init (in one run still computing 40 minutes later): the
default action ended the party without unwinding. Now SIGTERM unwinds like Ctrl-C, and the
Paillier pool's workers are ended with it. The party runs in a process group of its own, so that
every process it started can be found, and the test waits (bounded) for the group to empty.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from tests.harness import allow_list, coordinator, job, on_threads, party_data, run_parties
from tests.helpers import save_identity, write_table
from xclp.client.policy import PartyPolicy
from xclp.crypto import identity
from xclp.crypto.paillier import PaillierKeypair

XCLP = {"n_classes": 3, "k": 5, "lsh_bits": 256, "key_bits": 512, "insecure_test_keys": True}
ROWS = 1200


def group(pgid: int) -> list[int]:
    """The processes of process group `pgid` still alive (zombies excepted)."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) ": state, ppid, pgrp, ...
        if int(fields[2]) == pgid and fields[0] != "Z":
            out.append(int(entry.name))
    return out


def wait_until(condition, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {seconds:.0f} s waiting for {what}")
        time.sleep(0.1)


def files_of_a(keys, tmp_path: Path) -> tuple[dict[str, bytes], dict, dict]:
    """a's table, key and allow-list on disk (a runs as a process); b's and c's data and Paillier
    keys (they run in this process): (allow-list, b's and c's data, their keys)."""
    data = party_data(500, n=ROWS)
    write_table(tmp_path / "a.csv", data.X, data.y, data.ids)
    save_identity(keys["a"], tmp_path / "a.key")
    allow = allow_list(keys)
    (tmp_path / "allow.toml").write_text("[parties]\n" + "".join(
        f'{p} = "{identity.public_key_text(keys[p])}"\n' for p in allow))
    others = {p: party_data(501 + i, n=ROWS) for i, p in enumerate("bc")}
    paillier = {p: PaillierKeypair.generate(512, allow_insecure_test_size=True) for p in "bc"}
    return allow, others, paillier


def run_of_a(tmp_path: Path, address: str) -> list[str]:
    """`xclp-client run` of party a with the files `files_of_a` wrote, on a pool of two workers."""
    return [sys.executable, "-m", "xclp.client.cli", "run", "--coordinator", address, "--insecure", "--job", "x",
            "--party", "a", "--identity", str(tmp_path / "a.key"), "--peers", str(tmp_path / "allow.toml"),
            "--data", str(tmp_path / "a.csv"), "--id-column", "row_id", "--out", str(tmp_path / "out.csv"),
            "--paillier-bits", "512", "--insecure-test-keys", "--workers", "2", "--min-parties", "2",
            "--state", str(tmp_path / "state")]


@pytest.mark.slow
def test_a_party_stopped_by_sigterm_mid_securehamming_leaves_no_process_behind(keys, tmp_path: Path) -> None:
    allow, others, paillier = files_of_a(keys, tmp_path)
    with coordinator(allow, [job("x", "xclp", XCLP, step_seconds=120)]) as (_, address):
        party = subprocess.Popen(
            run_of_a(tmp_path, address),
            stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            rest = on_threads(["run"], lambda _: run_parties(
                address, "x", keys, others, paillier=paillier, policy=PartyPolicy(min_parties=2,
                                                                                  insecure_test_keys=True)),
                timeout=0.0)
            assert not rest  # the others run on in the background
            # the pool's workers are at work once a's group holds more than the party itself
            wait_until(lambda: len(group(party.pid)) >= 3 or party.poll() is not None, 120,
                       "a's Paillier pool to start")
            assert party.poll() is None, party.stderr.read() if party.stderr else ""
            started = group(party.pid)
            os.kill(party.pid, signal.SIGTERM)
            code = party.wait(timeout=60)
            said = party.stderr.read() if party.stderr else ""
        finally:
            if party.poll() is None:
                party.kill()
    assert code == 128 + signal.SIGTERM, said
    assert "stopped by SIGTERM; nothing written" in said
    assert len(started) >= 3  # the party, its forkserver and workers were there
    wait_until(lambda: not group(party.pid), 30, "every process of the party's group to end")
    assert not (tmp_path / "out.csv").exists()


@pytest.mark.slow
def test_a_party_killed_by_sigkill_mid_securehamming_leaves_no_worker_behind(keys, tmp_path: Path) -> None:
    """SIGKILL runs no `finally`: each pool worker ends as the party does (xclp/workers.py
    die_with_party), and with them the forkserver and the resource tracker. Before, all of them
    stayed under init for good, the workers blocked on their task queue."""
    allow, others, paillier = files_of_a(keys, tmp_path)
    with coordinator(allow, [job("x", "xclp", XCLP, step_seconds=120)]) as (_, address):
        party = subprocess.Popen(
            run_of_a(tmp_path, address),
            stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            on_threads(["run"], lambda _: run_parties(
                address, "x", keys, others, paillier=paillier, policy=PartyPolicy(min_parties=2,
                                                                                  insecure_test_keys=True)),
                timeout=0.0)
            wait_until(lambda: len(group(party.pid)) >= 4 or party.poll() is not None, 120,
                       "a's forkserver and two Paillier workers to start")
            assert party.poll() is None
            os.kill(party.pid, signal.SIGKILL)
            assert party.wait(timeout=30) == -signal.SIGKILL
            wait_until(lambda: not group(party.pid), 30, "every process of the killed party's group to end")
        finally:
            if party.poll() is None:
                party.kill()
            for pid in group(party.pid):  # (on the code before: the workers, left under init)
                os.kill(pid, signal.SIGKILL)


def busy_processes(count: int) -> list[subprocess.Popen]:
    """A loaded machine: `count` processes that spin (the test ends them)."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]


@pytest.mark.slow
def test_an_agent_stopped_by_sigterm_mid_securehamming_on_a_loaded_machine_exits_0_within_5_s(
        keys, tmp_path: Path) -> None:
    """`docker stop` gives an agent a grace period (10 s by default, 5 in the compose test) and then
    SIGKILLs it: under load the agent used to need longer and ended with 137. Two spinning processes
    load the machine's two cores; the stop comes as SecureHamming starts, when the agent's pool
    is starting its workers (tests/client/test_local_pool.py has that race alone)."""
    allow, others, paillier = files_of_a(keys, tmp_path)
    with coordinator(allow, [replace(job("x", "xclp", XCLP, step_seconds=120), datasets={"a": "demo"})]) \
            as (coord, address):
        (tmp_path / "agent.toml").write_text(
            f'party = "a"\nidentity = "a.key"\npeers = "allow.toml"\ncoordinator = "{address}"\ninsecure = true\n'
            f'out = "out"\nstate = "state"\npoll_seconds = 0.3\nworkers = 2\n[policy]\nmin_parties = 2\n'
            'insecure_test_keys = true\njob_types = ["xclp"]\n'
            '[datasets.demo]\npath = "a.csv"\nid_column = "row_id"\n')
        agent = subprocess.Popen([sys.executable, "-m", "xclp.client.cli", "agent", "--config",
                                  str(tmp_path / "agent.toml")], stderr=subprocess.PIPE, text=True,
                                 start_new_session=True, cwd=tmp_path)
        load: list[subprocess.Popen] = []
        try:
            rest = on_threads(["run"], lambda _: run_parties(
                address, "x", keys, others, paillier=paillier, policy=PartyPolicy(min_parties=2,
                                                                                  insecure_test_keys=True)),
                timeout=0.0)
            assert not rest
            load = busy_processes(2)
            wait_until(lambda: agent.poll() is not None or coord.job("x").activity.step == "secure_hamming", 180,
                       "SecureHamming to start")
            assert agent.poll() is None, agent.stderr.read() if agent.stderr else ""
            os.kill(agent.pid, signal.SIGTERM)
            sent = time.monotonic()
            try:
                code = agent.wait(timeout=60)
            finally:
                took = time.monotonic() - sent
            said = agent.stderr.read() if agent.stderr else ""
        finally:
            for p in load:
                p.kill()
                p.wait()
            if agent.poll() is None:
                agent.kill()
    assert code == 0, said
    assert took < 5.0, f"the agent took {took:.1f} s to stop after SIGTERM"
    assert "agent stopped" in said
    wait_until(lambda: not group(agent.pid), 30, "every process of the agent's group to end")
