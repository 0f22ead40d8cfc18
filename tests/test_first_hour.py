"""A newcomer's first hour (issue 49): each paper cut as the command a user typed and what it
printed, now with what it prints instead."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from xclp.crypto import identity
from xclp.v1.exits import EXIT_STDOUT_CLOSED

BIN = Path(sys.executable).parent


def closed_stdout(*args: str) -> subprocess.CompletedProcess:
    """`args` with stdout a pipe nobody reads (as `| head -1` leaves it once head has its line)."""
    read, write = os.pipe()
    os.close(read)
    try:
        return subprocess.run([str(BIN / args[0]), *args[1:]], stdout=write, stderr=subprocess.PIPE, text=True,
                              timeout=120)
    finally:
        os.close(write)


@pytest.mark.parametrize("command", [("xclp-server", "operator", "keygen", "--name", "alice"),
                                     ("xclp-client", "keygen", "--party", "a")], ids=["server", "client"])
def test_a_command_whose_stdout_is_closed_stops_quietly(command, tmp_path) -> None:
    """`xclp-server job submit … | head -1` printed a BrokenPipeError traceback."""
    done = closed_stdout(*command, "--out", str(tmp_path))
    assert done.returncode == EXIT_STDOUT_CLOSED, done.stderr
    assert "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr, done.stderr


def test_the_operator_key_gets_its_public_key_beside_it_as_a_party_key_does(tmp_path) -> None:
    done = subprocess.run([str(BIN / "xclp-server"), "operator", "keygen", "--name", "alice", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    public = (tmp_path / "alice.pub").read_text().strip()
    key = identity.load_private_key((tmp_path / "alice.key").read_bytes(), source="alice.key")
    assert public == identity.public_key_text(key) and done.stdout.strip() == f'alice = "{public}"'
    assert (tmp_path / "alice.pub").stat().st_mode & 0o777 == 0o644
    assert "alice.pub" in done.stderr
