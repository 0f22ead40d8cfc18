"""The coordinator's state in SQLite: job definitions, runs and their history (`--state`).

What is kept: each job definition's TOML text (parameters, expected parties, catalogue names of
the data sets), and for each run its id, nonce, state, timestamps, who joined with how many rows,
who dropped and why, its step timings and bytes, and which operator submitted or cancelled it;
and the nonces of signed calls until they expire. Never data, keys, masks, seeds or payloads.

Run states:

    queued --(no other run of the job in flight)--> joining --(roster sent)--> running
    running --> done | failed | cancelled;  joining --> failed | cancelled;  queued --> cancelled
    joining | running --(the coordinator stopped or crashed)--> interrupted (when it restarts)

One file, WAL journal (readers never block the writer), `synchronous=NORMAL`. Schema changes
are migrations: `MIGRATIONS[v]` brings a version-v database to v + 1, each in one transaction,
and `schema_version` records where a file is.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from xclp.errors import ConfigError, InvalidInput
from xclp.server.defaults import FINAL, IN_FLIGHT

STATES = ("queued", *IN_FLIGHT, *FINAL)

MIGRATIONS: tuple[str, ...] = (
    # 0 -> 1: definitions and runs
    """
    CREATE TABLE schema_version (version INTEGER NOT NULL);
    INSERT INTO schema_version VALUES (0);
    CREATE TABLE jobs (
        job_id TEXT PRIMARY KEY,
        job_type TEXT NOT NULL,
        definition TEXT NOT NULL,          -- the job file's TOML text
        source TEXT NOT NULL,              -- the file it came from, or "submitted"
        created_at REAL NOT NULL
    );
    CREATE TABLE runs (
        run_id INTEGER PRIMARY KEY AUTOINCREMENT,
        job_id TEXT NOT NULL REFERENCES jobs(job_id),
        nonce TEXT NOT NULL,               -- hex, public: every party of the run sees it
        state TEXT NOT NULL,
        reason TEXT NOT NULL DEFAULT '',
        created_at REAL NOT NULL,
        started_at REAL NOT NULL DEFAULT 0,
        ended_at REAL NOT NULL DEFAULT 0,
        steps TEXT NOT NULL DEFAULT '{}'   -- StepLedger.as_dict(): seconds and bytes per step
    );
    CREATE INDEX runs_by_job ON runs(job_id, run_id);
    CREATE TABLE run_parties (
        run_id INTEGER NOT NULL REFERENCES runs(run_id),
        party_id TEXT NOT NULL,
        state TEXT NOT NULL,               -- joined | dropped | never joined
        rows INTEGER NOT NULL DEFAULT 0,
        joined_at REAL NOT NULL DEFAULT 0,
        reason TEXT NOT NULL DEFAULT '',
        PRIMARY KEY (run_id, party_id)
    );
    """,
    # 1 -> 2: who submitted and who cancelled (the Admin API), and the signed calls' nonces
    """
    ALTER TABLE runs ADD COLUMN submitted_by TEXT NOT NULL DEFAULT '';
    ALTER TABLE runs ADD COLUMN cancelled_by TEXT NOT NULL DEFAULT '';
    CREATE TABLE call_nonces (nonce BLOB PRIMARY KEY, expires REAL NOT NULL);
    """,
    # 2 -> 3: with DP, the accountant's line of a finished run (what its releases spent)
    """
    ALTER TABLE runs ADD COLUMN privacy TEXT NOT NULL DEFAULT '';
    """,
)
SCHEMA_VERSION = len(MIGRATIONS)


@dataclass
class PartyRecord:
    party_id: str
    state: str
    rows: int = 0
    joined_at: float = 0.0
    reason: str = ""


@dataclass
class RunRecord:
    run_id: str
    job_id: str
    job_type: str
    nonce: str
    state: str
    reason: str
    created_at: float
    started_at: float
    ended_at: float
    steps: dict[str, dict[str, Any]]
    submitted_by: str
    cancelled_by: str
    parties: list[PartyRecord] = field(default_factory=list)
    privacy: str = ""  # with DP: the accountant's line (server/jobs/training.py)

    @property
    def bytes_total(self) -> int:
        return int(sum(s.get("bytes_in", 0) + s.get("bytes_relayed", 0) + s.get("bytes_out", 0)
                       for s in self.steps.values()))


class StateStore:
    """Thread-safe: one connection, one lock; every write is its own transaction."""

    def __init__(self, path: str | os.PathLike[str] = ":memory:", *, clock: Callable[[], float] = time.time) -> None:
        self.path = str(path)
        self.clock = clock
        self._lock = threading.RLock()
        if self.path != ":memory:":  # its directory, made if need be, the coordinator's alone
            parent = Path(self.path).parent
            try:
                parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            except OSError as exc:
                raise ConfigError(f"--state {self.path}: cannot make its directory {parent}: {exc.strerror}") from None
        try:
            self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None, timeout=30)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.execute("PRAGMA foreign_keys=ON")
            self.version = self._migrate()
        except sqlite3.DatabaseError as exc:
            raise ConfigError(f"--state {self.path} is not a usable xclp state database: {exc}") from None
        if self.path != ":memory:":
            os.chmod(self.path, 0o600)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def _migrate(self) -> int:
        with self._lock:
            has = self._db.execute("SELECT name FROM sqlite_master WHERE type='table' "
                                   "AND name='schema_version'").fetchone()
            version = self._db.execute("SELECT version FROM schema_version").fetchone()[0] if has else 0
            if version > SCHEMA_VERSION:
                raise ConfigError(f"--state {self.path} has schema version {version}; this xclp knows up to "
                                  f"{SCHEMA_VERSION}: upgrade xclp, or use another state file")
            for step in range(version, SCHEMA_VERSION):
                with self._tx() as db:
                    for statement in _statements(MIGRATIONS[step]):
                        db.execute(statement)
                    db.execute("UPDATE schema_version SET version = ?", (step + 1,))
            return SCHEMA_VERSION

    # --- definitions ------------------------------------------------------------------------

    def define_job(self, job_id: str, job_type: str, definition: str, source: str, *, replace: bool = False) -> None:
        """Record a job definition. The same text again is a no-op; another text for the id is
        refused, unless `replace` (a job file given at start: the operator's latest word)."""
        with self._tx() as db:
            row = db.execute("SELECT definition, job_type FROM jobs WHERE job_id = ?", (job_id,)).fetchone()
            if row is None:
                db.execute("INSERT INTO jobs VALUES (?, ?, ?, ?, ?)",
                           (job_id, job_type, definition, source, self.clock()))
            elif replace and row[0] != definition:
                db.execute("UPDATE jobs SET definition = ?, job_type = ?, source = ? WHERE job_id = ?",
                           (definition, job_type, source, job_id))
            elif row[0] != definition:
                raise InvalidInput(f"job {job_id!r} is already defined with other settings; a job id names one "
                                   "definition for good (its runs' history refers to it): give the changed job a new "
                                   "job_id")

    def definitions(self) -> list[tuple[str, str, str]]:
        """(job_id, definition TOML, source) of every job, oldest first."""
        with self._lock:
            return list(self._db.execute("SELECT job_id, definition, source FROM jobs ORDER BY created_at"))

    # --- runs -------------------------------------------------------------------------------

    def create_run(self, job_id: str, nonce: bytes, *, submitted_by: str = "") -> str:
        with self._tx() as db:
            cur = db.execute("INSERT INTO runs (job_id, nonce, state, created_at, submitted_by) VALUES (?, ?, "
                             "'queued', ?, ?)",
                             (job_id, nonce.hex(), self.clock(), submitted_by))
            return str(cur.lastrowid)

    def set_state(self, run_id: str, state: str, reason: str = "", *, cancelled_by: str = "") -> None:
        assert state in STATES, state
        now = self.clock()
        with self._tx() as db:
            if state == "joining":
                db.execute("UPDATE runs SET state = ?, started_at = ? WHERE run_id = ?", (state, now, int(run_id)))
            elif state in FINAL:
                db.execute("UPDATE runs SET state = ?, reason = ?, ended_at = ?, cancelled_by = ? WHERE run_id = ?",
                           (state, reason, now, cancelled_by, int(run_id)))
            else:
                db.execute("UPDATE runs SET state = ? WHERE run_id = ?", (state, int(run_id)))

    def set_nonce(self, run_id: str, nonce: bytes) -> None:
        with self._tx() as db:
            db.execute("UPDATE runs SET nonce = ? WHERE run_id = ?", (nonce.hex(), int(run_id)))

    def party(self, run_id: str, party_id: str, state: str, *, rows: int | None = None, reason: str = "") -> None:
        with self._tx() as db:
            db.execute("INSERT INTO run_parties (run_id, party_id, state) VALUES (?, ?, ?) "
                       "ON CONFLICT (run_id, party_id) DO UPDATE SET state = excluded.state",
                       (int(run_id), party_id, state))
            if rows is not None:
                db.execute("UPDATE run_parties SET rows = ?, joined_at = ? WHERE run_id = ? AND party_id = ?",
                           (rows, self.clock(), int(run_id), party_id))
            if reason:
                db.execute("UPDATE run_parties SET reason = ? WHERE run_id = ? AND party_id = ?",
                           (reason, int(run_id), party_id))

    def forget_party(self, run_id: str, party_id: str) -> None:
        """A party left before the roster went out (it may join again)."""
        with self._tx() as db:
            db.execute("DELETE FROM run_parties WHERE run_id = ? AND party_id = ?", (int(run_id), party_id))

    def set_steps(self, run_id: str, steps: dict[str, dict[str, Any]], privacy: str | None = None) -> None:
        """A run's per-step ledger, and once it has ended, with DP, the accountant's line."""
        with self._tx() as db:
            db.execute("UPDATE runs SET steps = ? WHERE run_id = ?", (json.dumps(steps), int(run_id)))
            if privacy is not None:
                db.execute("UPDATE runs SET privacy = ? WHERE run_id = ?", (privacy, int(run_id)))

    def interrupt_in_flight(self, reason: str, keep: set[str] = frozenset()) -> list[str]:  # type: ignore[assignment]
        """At start: runs a previous coordinator left joining or running become interrupted, but those
        of `keep` (going on from a checkpoint, server/resume.py)."""
        with self._tx() as db:
            ids = [str(r[0]) for r in db.execute(
                f"SELECT run_id FROM runs WHERE state IN ({', '.join('?' * len(IN_FLIGHT))})", IN_FLIGHT)
                   if str(r[0]) not in keep]
            db.executemany("UPDATE runs SET state = 'interrupted', reason = ?, ended_at = ? WHERE run_id = ?",
                           [(reason, self.clock(), int(i)) for i in ids])
            return ids

    def runs(self, *, job_id: str = "", run_id: str = "", states: tuple[str, ...] = (), limit: int = 0,
             oldest_first: bool = False) -> list[RunRecord]:
        where: list[str] = []
        args: list[Any] = []
        if run_id:
            where.append("r.run_id = ?")
            args.append(int(run_id))
        if job_id:
            where.append("r.job_id = ?")
            args.append(job_id)
        if states:
            where.append(f"r.state IN ({', '.join('?' * len(states))})")
            args.extend(states)
        sql = ("SELECT r.run_id, r.job_id, j.job_type, r.nonce, r.state, r.reason, r.created_at, r.started_at, "
               "r.ended_at, r.steps, r.submitted_by, r.cancelled_by, r.privacy "
               "FROM runs r JOIN jobs j ON j.job_id = r.job_id"
               + (f" WHERE {' AND '.join(where)}" if where else "")
               + f" ORDER BY r.run_id {'ASC' if oldest_first else 'DESC'}" + (" LIMIT ?" if limit else ""))
        if limit:
            args.append(limit)
        with self._lock:
            rows = list(self._db.execute(sql, args))
            records = [RunRecord(str(r[0]), r[1], r[2], r[3], r[4], r[5], r[6], r[7], r[8], json.loads(r[9]), r[10],
                                 r[11], privacy=r[12])
                       for r in rows]
            for record in records:
                record.parties = [PartyRecord(*p) for p in self._db.execute(
                    "SELECT party_id, state, rows, joined_at, reason FROM run_parties WHERE run_id = ? ORDER BY "
                    "party_id",
                    (int(record.run_id),))]
        return records

    def run(self, run_id: str) -> RunRecord:
        if not run_id.isdigit():
            raise InvalidInput(f"no run {run_id!r}: run ids are numbers (see `xclp-server job list`)")
        found = self.runs(run_id=run_id)
        if not found:
            raise InvalidInput(f"no run {run_id!r} on this coordinator (see `xclp-server job list`)")
        return found[0]

    def count_by_state(self) -> dict[str, int]:
        with self._lock:
            return dict(self._db.execute("SELECT state, COUNT(*) FROM runs GROUP BY state"))

    # --- signed calls -----------------------------------------------------------------------

    def remember_nonce(self, nonce: bytes, now: float, expires: float) -> bool:
        """Record a signed call's nonce until `expires` (forgetting those expired at `now`, both on
        the verifier's clock); False if it is already recorded (a replay)."""
        with self._tx() as db:
            db.execute("DELETE FROM call_nonces WHERE expires < ?", (now,))
            try:
                db.execute("INSERT INTO call_nonces VALUES (?, ?)", (nonce, expires))
            except sqlite3.IntegrityError:
                return False
        return True


def _statements(script: str) -> list[str]:
    """A migration script's statements (none of them holds a ';' inside a literal or comment)."""
    return [s.strip() for s in script.split(";") if s.strip()]
