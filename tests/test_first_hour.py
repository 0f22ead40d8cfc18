"""A newcomer's first hour: each paper cut as the command a user typed and what it
printed, now with what it prints instead."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
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


def test_job_show_and_list_json_give_counts_as_numbers() -> None:
    """`job list --json` had "rows": "40" and "bytes_total": "1234" (protobuf's JSON for 64-bit ints)."""
    from xclp.server.admin_cli import _as_dict
    from xclp.v1 import xclp_pb2 as pb

    info = pb.RunInfo(run_id="7", bytes_total=2**40 + 1)
    info.parties.add(party_id="a", rows=40)
    info.steps.add(name="secure_hamming", rounds=2, bytes_in=123, bytes_relayed=2**33)
    data = _as_dict(info)
    assert data["bytes_total"] == 2**40 + 1 and data["parties"][0]["rows"] == 40
    assert data["steps"][0]["bytes_in"] == 123 and data["steps"][0]["bytes_relayed"] == 2**33
    assert data["steps"][0]["rounds"] == 2 and data["run_id"] == "7"


def test_a_party_whose_own_min_parties_stops_a_run_the_job_would_go_on_with_says_which_setting_decided(keys):
    """The job file says min_parties = 2, the parties run with the default --min-parties 3; c dies
    as the common seed is drawn. a and b said at Join that they stop below 3, and now say that their own
    setting, not the job's, ended their part."""
    from tests.harness import DiesAt, allow_list, coordinator, job, party_data, run_parties
    from xclp.client.policy import PartyPolicy

    class Dies(DiesAt):
        at = "seed"

    datas = {p: party_data(10 + i) for i, p in enumerate("abc")}
    progress: dict[str, list[str]] = {}
    with coordinator(allow_list(keys), [job("f", "flynn", {"n_classes": 3, "m": 128, "s": 2, "rho": 8},
                                            min_parties=2)]) as (_, address):
        results = run_parties(address, "f", keys, datas, sessions={"c": Dies}, policy=PartyPolicy(min_parties=3),
                              progress=progress)
    for p in "ab":
        assert "note: the job goes on with 2 parties (its min_parties); this party stops below 3 (--min-parties, " \
               "default 3)" in progress[p]
        message = str(results[p])
        assert "fewer than this party's minimum of 3 (--min-parties, default 3) (the job itself would go on with " \
               "2, its min_parties: this party's own setting decided)" in message, message


def test_a_party_without_the_coordinators_ca_is_told_at_once_what_to_pass(tmp_path, keys) -> None:
    """`run` without --ca-cert retried for its whole connect timeout, printing gRPC handshake lines,
    and ended "connection refused"."""
    import time

    from tests.harness import coordinator, job
    from tests.helpers import deployment
    from xclp.client.connection import Connection, ConnectionConfig
    from xclp.errors import ConfigError
    from xclp.server.config import TlsFiles

    allow = deployment(tmp_path, ["a", "b"])
    key = identity.load_private_key((tmp_path / "keys" / "a.key").read_bytes(), source="a.key")
    tls = TlsFiles(tmp_path / "certs" / "server.pem", tmp_path / "certs" / "server-key.pem")
    flynn = job("f", "flynn", {"n_classes": 3, "m": 128, "s": 2, "rho": 8}, parties=("a", "b"))
    with coordinator(allow, [flynn], tls=tls) as (_, address):
        conn = Connection(ConnectionConfig(f"localhost:{address.rsplit(':', 1)[1]}"), "f")
        started = time.monotonic()
        with pytest.raises(ConfigError, match="does not trust .*pass --ca-cert with the CA that signed it"):
            conn.challenge(key, "a", wait_seconds=120)
        assert time.monotonic() - started < 60  # at once, not after the connect timeout
        conn.close()


def test_after_job_cancel_a_call_racing_the_end_hears_the_run_was_cancelled_not_that_its_token_expired(keys):
    """`job cancel` ended one party with "the run was cancelled" (exit 5) and two with "session token
    has expired" (exit 4): their Push raced the JobEnd. Such a call now hears how the run ended."""
    from tests.harness import allow_list, job, key_bundle
    from xclp.errors import RunCancelled
    from xclp.server.coordinator import Coordinator
    from xclp.v1 import xclp_pb2 as pb
    from xclp.v1.exits import EXIT_DROPPED, exit_code

    coord = Coordinator(allow_list(keys), [job("f", "flynn", {"n_classes": 3, "m": 128, "s": 2, "rho": 8})])
    run = coord.job("f")
    summary = pb.DataSummary(rows=10, dim=4, labeled_rows=10)
    tokens = {}
    for p in "abc":
        bundle = identity.sign_bundle(keys[p], key_bundle(keys[p], p, "f", spec=run.config.spec(), nonce=run.run_nonce,
                                                          summary=summary))
        response = coord.join(pb.JoinRequest(job_id="f", summary=summary, bundle=pb.SignedBundle(
            bundle=bundle.bundle, signature=bundle.signature)))
        tokens[p] = response.session_token
    coord.cancel(run.run_id, "alice", "wrong data set")
    for p in "abc":  # each party's Pull stream carries its JobEnd ...
        run.parties[p].end_delivered = True
    with pytest.raises(RunCancelled, match="the run was cancelled: wrong data set") as raised:
        coord.authenticate(tokens["b"], "f")  # ... while b's Push is on its way
    assert exit_code(raised.value) == EXIT_DROPPED


def test_demo_with_a_data_dir_without_row_ids_says_what_it_needs_before_starting_anything(tmp_path) -> None:
    """`demo --data-dir` needed a row_id column and then died with a TimeoutExpired traceback."""
    from xclp.demo import DEMO_DATA, PARTIES

    for party in PARTIES:
        for name in (f"{party}.csv", f"{party}.truth.csv"):
            (tmp_path / name).write_text((DEMO_DATA / name).read_text().replace("row_id", "patient"))
    done = subprocess.run([str(BIN / "xclp-client"), "demo", "--data-dir", str(tmp_path), "--key-bits", "512",
                           "--insecure-test-keys"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert f"--data-dir {tmp_path}: hospital-a.csv has no row_id column; the demo reads row_id, label" in done.stderr
    assert "coordinator listening" not in done.stderr  # refused before anything started


def test_text_in_a_numeric_column_is_said_before_any_coordinator_answers(tmp_path) -> None:
    """A CSV with text in a numeric column was reported only after a coordinator answered."""
    from xclp.client.api import read_data

    (tmp_path / "a.csv").write_text("row_id,x,y,label\nr0,1.5,2,0\nr1,oops,3,1\n")
    said: list[str] = []
    read_data(tmp_path / "a.csv", id_column="row_id", progress=said.append)  # no coordinator anywhere
    assert any(line.startswith("WARNING: ") and "column 'x'" in line and "'oops' is not a number" in line
               and "declares that column categorical" in line for line in said), said


def test_simulate_prints_alone_federated_and_pooled_and_warns_where_federating_does_not_help(tmp_path) -> None:
    """c's labels mean something else (classes 0 and 1 swapped): federating misleads c, which the
    comparison shows, with intervals, and warns about, beside a logistic regression on c's own
    rows that does better; the same rows are held out every time."""
    rng = np.random.default_rng(5)
    centres = rng.normal(scale=4.0, size=(3, 4))
    for party in ("a", "b", "c"):
        y = rng.integers(0, 3, size=90)
        X = centres[y] + rng.normal(size=(90, 4))
        seen = np.where(rng.random(90) < 0.6, y, -1)
        if party == "c":
            seen = np.where(seen == 0, 1, np.where(seen == 1, 0, seen))
        lines = ["row_id,f0,f1,f2,f3,label"] + [
            f"{party}{i}," + ",".join(f"{v:.5f}" for v in X[i]) + f",{'' if seen[i] < 0 else seen[i]}"
            for i in range(90)]
        (tmp_path / f"{party}.csv").write_text("\n".join(lines) + "\n")
    (tmp_path / "job.toml").write_text('type = "xclp"\n[params]\nn_classes = 3\nlsh_bits = 256\nk = 5\n'
                                       'key_bits = 512\ninsecure_test_keys = true\n')
    command = [str(BIN / "xclp-client"), "simulate", str(tmp_path / "job.toml"),
               *(str(tmp_path / f"{p}.csv") for p in "abc"), "--id-column", "row_id"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    cell = re.compile(r"(\d\.\d{3}) \[(\d\.\d\d), (\d\.\d\d)\]")  # an accuracy and its 95 % interval
    rows = {line.split()[0]: (int(line.split()[1]), [tuple(map(float, c)) for c in cell.findall(line)])
            for line in done.stdout.splitlines() if line[:1] in "abc" and len(cell.findall(line)) == 4}
    assert set(rows) == {"a", "b", "c"}
    assert all(low <= value <= high for _, cells in rows.values() for value, low, high in cells)
    held, (alone, federated, logistic, pooled) = rows["c"]
    assert federated[2] < alone[1] and held >= 1  # worse beyond the intervals
    assert "WARNING: for c, federating is worse than its own rows alone" in done.stdout
    assert logistic[0] > federated[2] and "a logistic regression on its own labeled rows does better" in done.stdout
    assert subprocess.run(command, capture_output=True, text=True, timeout=300).stdout == done.stdout  # same rows
