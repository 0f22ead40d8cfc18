"""The coordinator's state store (server/store.py): migrations from an older schema, what a restart
keeps and interrupts, and that nothing secret reaches the file."""

from __future__ import annotations

import base64
import sqlite3

import pytest

from tests.harness import PARTIES, allow_list, job, party_data, run_parties
from xclp.errors import ConfigError, InvalidInput
from xclp.server.coordinator import Coordinator
from xclp.server.service import build_server
from xclp.server.store import MIGRATIONS, SCHEMA_VERSION, StateStore, _statements

FLYNN = {"n_classes": 3, "m": 128, "s": 2, "rho": 8}


def version_1_database(path) -> None:
    """A state file as the first schema left it, with one finished run in it."""
    db = sqlite3.connect(path, isolation_level=None)
    for statement in _statements(MIGRATIONS[0]):
        db.execute(statement)
    db.execute("UPDATE schema_version SET version = 1")
    db.execute("INSERT INTO jobs VALUES ('old-job', 'flynn', 'job_id = \"old-job\"', 'old.toml', 1.0)")
    db.execute("INSERT INTO runs (job_id, nonce, state, reason, created_at, started_at, ended_at, steps) "
               "VALUES ('old-job', 'ab', 'done', 'job complete', 1.0, 2.0, 3.0, "
               "'{\"sum\": {\"seconds\": 1.5, \"rounds\": 1, \"bytes_in\": 10, \"bytes_relayed\": 0, \"bytes_out\": "
               "5}}')")
    db.execute("INSERT INTO run_parties VALUES (1, 'a', 'joined', 40, 2.0, '')")
    db.close()


def test_a_database_of_the_older_schema_is_migrated_and_keeps_its_history(tmp_path):
    path = tmp_path / "state.db"
    version_1_database(path)
    store = StateStore(path)
    assert store.version == SCHEMA_VERSION == 3
    (run,) = store.runs()
    assert (run.run_id, run.job_id, run.state, run.reason) == ("1", "old-job", "done", "job complete")
    assert run.bytes_total == 15
    assert (run.submitted_by, run.cancelled_by) == ("", "")  # the columns version 2 added
    assert run.privacy == ""  # and version 3's
    assert [(p.party_id, p.rows) for p in run.parties] == [("a", 40)]
    # version 2's table
    assert store.remember_nonce(b"n" * 16, 1.0, 1e12) and not store.remember_nonce(b"n" * 16, 2.0, 1e12)
    assert store.create_run("old-job", b"\x01") == "2"  # ids go on after the old ones
    store.close()
    assert sqlite3.connect(path).execute("PRAGMA journal_mode").fetchone() == ("wal",)
    assert (path.stat().st_mode & 0o777) == 0o600


def test_a_database_of_a_newer_schema_or_not_a_database_is_refused_with_what_to_do(tmp_path):
    path = tmp_path / "new.db"
    StateStore(path).close()
    sqlite3.connect(path, isolation_level=None).execute("UPDATE schema_version SET version = 99")
    with pytest.raises(ConfigError, match="schema version 99; this xclp knows up to 3: upgrade xclp"):
        StateStore(path)
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"not a database at all" * 100)
    with pytest.raises(ConfigError, match="is not a usable xclp state database"):
        StateStore(junk)


def test_a_restart_keeps_history_interrupts_runs_in_flight_and_resumes_queued_ones(tmp_path, keys):
    path = tmp_path / "state.db"
    allow = allow_list(keys)
    done, waiting = job("f", "flynn", FLYNN), job("w", "flynn", FLYNN, join_seconds=600)
    coord = Coordinator(allow, [done, waiting], store=StateStore(path))
    server, port = build_server(coord, "127.0.0.1:0", tls=None)
    server.start()
    coord.start()
    results = run_parties(f"127.0.0.1:{port}", "f", keys, {p: party_data(i) for i, p in enumerate(PARTIES)})
    assert all(not isinstance(r, BaseException) for r in results.values()), results
    queued = coord._queue_run("w", "alice")  # a second run of w while the first is joining
    server.stop(0).wait()
    coord._stop.set()  # the process dies here: no graceful stop marks anything
    # no key reached the file: no signed bundle, no signature, no key-agreement key, in any encoding
    stored = b"".join(f.read_bytes() for f in tmp_path.glob("state.db*"))
    job_f = coord.runs["1"]
    secrets = [b for party in job_f.parties.values() for b in (party.signed.bundle, party.signed.signature,
                                                                party.bundle.x25519_public)]
    for x in secrets:  # raw, hex or base64
        assert len(x) >= 32 and not any(form[:32] in stored for form in (x, x.hex().encode(), base64.b64encode(x)))
    assert job_f.run_nonce.hex().encode() in stored  # the check can see what is there
    # the process "crashed": nothing marked the runs; a new coordinator opens the same file
    store = StateStore(path)
    states = {r.run_id: (r.job_id, r.state) for r in store.runs()}
    assert states == {"1": ("f", "done"), "2": ("w", "joining"), queued: ("w", "queued")}
    coord = Coordinator(allow, [waiting], store=store)
    states = {r.run_id: (r.job_id, r.state, r.reason) for r in store.runs()}
    assert states["1"][:2] == ("f", "done")
    assert states["2"][:2] == ("w", "interrupted")
    assert "the coordinator stopped while the run was in flight" in states["2"][2]
    assert states[queued][:2] == ("w", "joining")  # the queued run resumed: w was given again
    assert coord.jobs["w"].run_id == queued
    run_f = store.run("1")
    assert {p.party_id for p in run_f.parties} == set(PARTIES) and run_f.steps["sum"]["rounds"] == 1
    with pytest.raises(InvalidInput, match="no run '99'"):
        store.run("99")


def test_the_state_directory_is_made_if_need_be_and_kept_to_the_coordinator(tmp_path):
    """The docs' `state = "state/xclp.db"` failed on a fresh directory ("directory state
    does not exist"); the coordinator now makes it, readable by itself alone."""
    store = StateStore(tmp_path / "state" / "nested" / "xclp.db")
    store.close()
    assert (tmp_path / "state" / "nested").stat().st_mode & 0o777 == 0o700
    assert (tmp_path / "state" / "nested" / "xclp.db").stat().st_mode & 0o777 == 0o600
    (tmp_path / "a-file").write_text("")
    with pytest.raises(ConfigError, match="cannot make its directory .*a-file/state"):
        StateStore(tmp_path / "a-file" / "state" / "xclp.db")
