"""The coordinator's state across jobs and runs: job definitions, runs, admission tokens and the
deadline clock.

Jobs and runs (docs/operating.md): a job definition (a job file, given at
start or submitted at runtime) can run many times. Each run is a fresh `Job` state machine with
its own run id and nonce (every key bundle of the run signs the nonce, so a bundle of an earlier
run is refused). At most one run of a job is in flight (joining or running) at a time, since
parties name the job, not the run, when they join; later runs of it wait `queued`. Every
transition is recorded in the state store (server/store.py) as the job reports it
(`RunEvents`); when the coordinator starts, runs a previous process left in flight become
`interrupted`, and queued runs resume.

Authentication choice (docs/design.md §2, §3): a party proves who it is once, at Join, with a key bundle
signed by its allow-listed Ed25519 identity key. The coordinator answers with a random 256-bit
session token bound to that (run, party, bundle); every Pull and Push carries it as metadata and
every frame's `sender` must be the party the token belongs to. Over TLS the token is as good as
a per-message signature for the coordinator's purposes (TLS already authenticates and protects
the channel) and costs nothing per 3 MiB chunk; what the *peers* must trust — the key-agreement
keys — stays end-to-end signed and is checked by every party itself (crypto/identity.py).
"""

from __future__ import annotations

import contextlib
import hmac
import logging
import secrets
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from xclp.crypto.identity import SignedBundle
from xclp.errors import (
    ConfigError,
    InvalidInput,
    InvalidSignature,
    PeerDropped,
    ProtocolError,
    RunCancelled,
    RunInterrupted,
    XclpError,
)
from xclp.runtime import write_json_atomic
from xclp.server.admission import authenticated
from xclp.server.config import JobConfig, parse_job, reread_job
from xclp.server.events import Observer, Stage
from xclp.server.metrics import Metrics
from xclp.server.resume import Checkpoints, Saver, restore, token_hash
from xclp.server.run import Run
from xclp.server.store import RunRecord, StateStore
from xclp.server.views import run_info
from xclp.v1 import xclp_pb2 as pb
from xclp.v1.spec import party_view
from xclp.workers import DaskWorkers

log = logging.getLogger("xclp.server")

TICK_SECONDS = 0.2


class Coordinator:
    def __init__(self, allow_list: Mapping[str, bytes], jobs: Sequence[JobConfig] = (), *,
                 observer: Observer | None = None, clock: Callable[[], float] = time.monotonic,
                 store: StateStore | None = None, metrics: Metrics | None = None,
                 job_root: Path | None = None, job_texts: Sequence[tuple[str, str]] = (),
                 checkpoints: Checkpoints | None = None, offload: DaskWorkers | None = None) -> None:
        """`jobs` start a run each now (job files given at start); `job_texts` are their
        (TOML text, file) as recorded in the store. `job_root` holds submitted jobs' files.
        `checkpoints`: where runs are saved to go on after a crash (server/resume.py); a run that
        a previous process left running with a checkpoint there goes on. `offload`: the operator's
        Dask cluster, where every run's influence solve goes (server/offload.py)."""
        self.offload = offload
        self.allow_list = allow_list
        self.observer = observer
        self.store = store if store is not None else StateStore()
        self.metrics = metrics
        self.job_root = job_root
        self.jobs: dict[str, Run] = {}  # job id -> its latest run that left the queue
        self.runs: dict[str, Run] = {}  # run id -> the runs this process started
        self.definitions: dict[str, JobConfig] = {}
        self._queued: dict[str, list[str]] = {}  # job id -> queued run ids, oldest first
        self._tokens: dict[bytes, tuple[Run, str]] = {}
        self._lock = threading.RLock()
        self._clock = clock
        self._stop = threading.Event()
        self._shutting_down = False
        self._cancelled_by: dict[str, str] = {}  # run id -> the operator who cancelled it
        self._steps_saved: dict[str, float] = {}  # run id -> when its step ledger was last stored
        self._ticker = threading.Thread(target=self._tick_loop, name="xclp-deadlines", daemon=True)
        self.checkpoints = checkpoints
        self._texts: dict[str, tuple[str, str]] = {}  # run id -> (job file text, source) it runs
        self._saver = Saver(checkpoints, self._saveable, self._stop) if checkpoints is not None else None
        seen: set[str] = set()
        for config in jobs:
            if config.job_id in seen:
                raise ConfigError(f"two job files define job {config.job_id!r}")
            seen.add(config.job_id)
            self._check_parties(config)
        restored = self._restore_runs()
        interrupted = self.store.interrupt_in_flight(
            "the coordinator stopped while the run was in flight", keep=restored)
        if interrupted:
            log.warning("runs interrupted by the coordinator's restart: %s", ", ".join(interrupted))
        for job_id, text, source in self.store.definitions():
            self._restore(job_id, text, source)
        for config, (text, name) in zip(jobs, list(job_texts) or [("", "in-process")] * len(jobs)):
            self.definitions[config.job_id] = config  # a job file given at start is the operator's latest word
            self.store.define_job(config.job_id, config.job_type, text or repr(config.params), name, replace=True)
        self._interrupted = {job: last[0].run_id for job in self.definitions  # its latest, if a stop or crash cut it
                             if (last := self.store.runs(job_id=job, limit=1)) and last[0].state == "interrupted"}
        for record in self.store.runs(states=("queued",), oldest_first=True):
            if record.job_id in self.definitions:
                self._queued.setdefault(record.job_id, []).append(record.run_id)
            else:
                self.store.set_state(record.run_id, "interrupted", "its job definition can no longer be read")
        for config in jobs:
            if config.job_id not in self.jobs:  # a run of it going on from a checkpoint is this start's run
                self._queue_run(config.job_id, "")
        for job_id, cut in self._interrupted.items():  # a submitted job a stop or crash cut runs again, as
            if not self._queued.get(job_id) and job_id not in self.jobs:  # a job file given at start does
                again = self._queue_run(job_id, self.store.run(cut).submitted_by)
                log.warning("job %s: run %s queued in place of run %s, which the restart interrupted", job_id,
                            again, cut)
        for job_id in list(self._queued):
            self._advance(job_id)

    # --- definitions and runs ---------------------------------------------------------------

    def _check_parties(self, config: JobConfig) -> None:
        if unknown := sorted(set(config.expected_parties) - set(self.allow_list)):
            raise ConfigError(f"job {config.job_id!r} expects parties not on the allow-list: {', '.join(unknown)}")

    def _restore(self, job_id: str, text: str, source: str) -> None:
        """A stored definition, read again at start (a submitted one resolves under `job_root`)."""
        if source != SUBMITTED:
            return  # a job file: it runs again only if given at start again (it may have changed)
        try:
            config = parse_job(text, f"stored job {job_id}", self.job_root)
            self._check_parties(config)
        except XclpError as exc:
            log.warning("stored job %s cannot be read again: %s", job_id, exc)
            return
        self.definitions[job_id] = config

    def submit(self, text: str, name: str, submitted_by: str) -> str:
        """A job file's text from the operator: define it (or find its same definition) and queue a run."""
        config = parse_job(text, name, self.job_root)
        self._check_parties(config)
        with self._lock:
            self.store.define_job(config.job_id, config.job_type, text, SUBMITTED)
            self.definitions.setdefault(config.job_id, config)
            run_id = self._queue_run(config.job_id, submitted_by)
            self._advance(config.job_id)
        log.info("job %s: run %s submitted by %s", config.job_id, run_id, submitted_by)
        return run_id

    def _queue_run(self, job_id: str, submitted_by: str) -> str:
        run_id = self.store.create_run(job_id, b"", submitted_by=submitted_by)
        self._queued.setdefault(job_id, []).append(run_id)
        return run_id

    def _advance(self, job_id: str) -> None:
        """Start the oldest queued run of `job_id` if none of its runs is in flight."""
        with self._lock:
            current = self.jobs.get(job_id)
            queue = self._queued.get(job_id)
            if self._shutting_down or not queue or (current is not None and not current.stage.ended):
                return
            run_id = queue.pop(0)
            config = self.definitions[job_id]
            job = Run(config, self.allow_list, clock=self._clock, observer=self.observer)
            job.run_id, job.offload = run_id, self.offload
            job.events = self
            text, source = next(((t, s) for j, t, s in self.store.definitions() if j == job_id), ("", ""))
            if source != SUBMITTED and Path(source).is_file():  # read again after a restart, from any directory
                source = str(Path(source).resolve())
            self._texts[run_id] = (text, source)
            self.store.set_nonce(run_id, job.run_nonce)
            self.store.set_state(run_id, "joining")
            self.jobs[job_id] = job
            self.runs[run_id] = job
        log.info("job %s: run %s open for joining", job_id, run_id)

    def cancel(self, run_id: str, operator: str, reason: str = "") -> None:
        reason = reason or f"cancelled by the operator {operator}"
        with self._lock:
            record = self.store.run(run_id)
            queue = self._queued.get(record.job_id, [])
            if run_id in queue:
                queue.remove(run_id)
                self.store.set_state(run_id, "cancelled", reason, cancelled_by=operator)
                return
            job = self.runs.get(run_id)
        if job is None:
            raise InvalidInput(f"run {run_id} is {record.state}; only queued, joining or running runs can be cancelled")
        self._cancelled_by[run_id] = operator
        job.cancel(reason)

    def offers(self, party_id: str) -> list[pb.Offer]:
        """Runs open for joining that expect `party_id` and that it has not joined; `rejoin`: its place kept."""
        with self._lock:
            live = [(job, job.parties.get(party_id)) for job in self.jobs.values() if not job.stage.ended]
        return [pb.Offer(run_id=job.run_id, spec=party_view(job.config.spec(), party_id), rejoin=party is not None)
                for job, party in live if party_id in job.config.expected_parties and (
                    job.stage is Stage.JOINING if party is None else party.lost_at is not None and not party.ended)]

    def start(self) -> None:
        self._ticker.start()
        if self._saver is not None:
            self._saver.start()

    def _saveable(self) -> list[tuple[Run, dict[str, bytes], tuple[str, str]]]:
        """Each running run, its parties' token hashes and its job file (text, source), for the Saver."""
        with self._lock:
            tokens = [(r, pid, h) for h, (r, pid) in self._tokens.items()]
            return [(job, {pid: h for r, pid, h in tokens if r is job}, self._texts.get(job.run_id, ("", "")))
                    for job in self.runs.values() if job.stage is Stage.RUNNING]

    def _restore_runs(self) -> set[str]:
        """Runs a previous process left running with a checkpoint: each goes on (server/resume.py), or,
        if it cannot be read back, is left to be marked interrupted with the others."""
        if self.checkpoints is None:
            return set()
        restored: set[str] = set()
        for record in self.store.runs(states=("running",)):
            try:
                saved = self.checkpoints.read(record.run_id)
                if saved is None:
                    continue
                text, source = saved.meta["definition"]
                config = parse_job(text, f"stored job {record.job_id}", self.job_root) if source == SUBMITTED \
                    else reread_job(text, source)
                self._check_parties(config)
                run, tokens = restore(saved, config, self.allow_list, clock=self._clock, observer=self.observer)
            except Exception as exc:  # a checkpoint this version cannot read back: the run is interrupted
                known = isinstance(exc, (XclpError, KeyError, TypeError, ValueError))  # else: with the traceback
                log.warning("run %s cannot go on from its checkpoint: %s", record.run_id, exc, exc_info=not known)
                self.checkpoints.remove(record.run_id)
                continue
            run.events, run.offload = self, self.offload
            self._texts[run.run_id] = (text, source)
            self.jobs[config.job_id] = self.runs[run.run_id] = run
            self._tokens.update((h, (run, pid)) for h, pid in tokens.items())
            # saved again at once with the attempt it goes on at: should this process die before its
            # first checkpoint, the next one starts a later attempt still
            assert self._saver is not None
            self._saver.save(run, {pid: h for h, pid in tokens.items()}, (text, source), force=True)
            restored.add(run.run_id)
            log.warning("job %s: run %s goes on from its checkpoint; its parties have %g s to reconnect",
                        config.job_id, run.run_id, config.reconnect_seconds)
        return restored

    def stop(self) -> None:
        """Stop the deadline clock; a run at a step it can go on from is saved to go on at the next start
        (its parties reconnect, as after a crash); the others end as interrupted, and their parties hear why."""
        with self._lock:
            self._shutting_down = True
            live = [job for job in self.runs.values() if not job.stage.ended]
        saver = self._saver
        kept = {job for job, tokens, text in self._saveable() if saver is not None and saver.keep(job, tokens, text)}
        for job in live:
            with contextlib.suppress(InvalidInput):  # it ended meanwhile
                if job not in kept:
                    job.cancel(f"the coordinator is shutting down; run {job.run_id} is interrupted", interrupted=True)
        self._stop.set()

    def all_finished(self) -> bool:
        """At least one run started in this process, and every run is over with none queued."""
        with self._lock:
            return (bool(self.runs) and not any(self._queued.values())
                    and all(job.stage.ended for job in self.jobs.values()))

    def job(self, job_id: str) -> Run:
        """The run of `job_id` that parties join now."""
        with self._lock:
            job = self.jobs.get(job_id)
            queued = bool(self._queued.get(job_id))
        if job is None or (job.stage.ended and not queued):
            if job_id not in self.definitions:
                raise InvalidInput(f"no job {job_id!r} on this coordinator")
            said = "it has had no run"
            for last in self.store.runs(job_id=job_id, limit=1):  # of this process or an earlier one
                state, reason = last.state, last.reason
                if job is not None and last.run_id == job.run_id and state in ("joining", "running"):
                    state, reason = job.stage.value, job.outcome_reason  # ended, and not stored yet
                said = f"its last run, {last.run_id}, is {state}" + (f": {reason}" if reason else "")
            raise ProtocolError(f"job {job_id!r} has no run open for joining ({said}); the operator starts one with "
                                "`xclp-server job submit`")
        return job

    # --- what the operator sees ----------------------------------------------------------------

    def run_info(self, run_id: str) -> pb.RunInfo:
        return self._info(self.store.run(run_id))

    def list_runs(self, job_id: str = "", limit: int = 50) -> list[pb.RunInfo]:
        return [self._info(r) for r in self.store.runs(job_id=job_id, limit=limit)]

    def _info(self, record: RunRecord) -> pb.RunInfo:  # server/views.py, with this process's run if it has it
        return run_info(record, self.runs.get(record.run_id), self.definitions.get(record.job_id))

    # --- the parties' calls -------------------------------------------------------------------

    def challenge(self, party_id: str, request: pb.ChallengeRequest) -> pb.ChallengeResponse:
        """For an allow-listed party (its call verified): the run's nonce and the spec as it sees it."""
        return self.job(request.job_id).challenge(party_id)

    def decline(self, party_id: str, request: pb.DeclineRequest) -> None:
        """An allow-listed party's (its call verified) word that it will not join the open run."""
        self.job(request.job_id).decline(party_id, request.run_nonce, request.reason)

    def join(self, request: pb.JoinRequest) -> pb.JoinResponse:
        try:
            signed = SignedBundle(request.bundle.bundle, request.bundle.signature)
            authenticated(self.allow_list, signed)  # before the job: a stranger learns nothing of it
            job = self.job(request.job_id)
            bundle = job.join(signed, request.summary, frozenset(request.capabilities))
        except XclpError as exc:
            if self.metrics is not None:
                self.metrics.refused_joins.labels(type(exc).__name__).inc()
            raise
        token = secrets.token_bytes(32)
        with self._lock:
            self._tokens[token_hash(token)] = (job, bundle.party_id)
        return pb.JoinResponse(session_token=token, spec=party_view(job.config.spec(), bundle.party_id))

    def authenticate(self, token: bytes | None, job_id: str) -> tuple[Run, str]:
        """(run, party id) the token was issued for; the call must name that run's job."""
        if not token:
            raise InvalidSignature("missing session token: call Join first and send x-xclp-token-bin")
        with self._lock:
            entry = self._tokens.get(token_hash(token))
        if entry is None and job_id in self._interrupted:  # issued before this process started, and lost
            raise RunInterrupted(f"run {self._interrupted[job_id]} of job {job_id!r} was interrupted: the "
                                 "coordinator stopped while it was in flight, and restarted")
        if entry is None or not hmac.compare_digest(entry[0].config.job_id.encode(), job_id.encode()):
            raise InvalidSignature(f"the session token is not valid for job {job_id!r}")
        job, party_id = entry
        party = job.parties.get(party_id)
        if party is not None and party.end_delivered and job.stage in (Stage.CANCELLED, Stage.FAILED):
            # a call racing the JobEnd of a run that ended early: say how it ended, as the JobEnd does
            # (after `job cancel` two of three parties said "session token has expired")
            if job.stage is Stage.CANCELLED:
                if self._shutting_down:
                    raise RunInterrupted(job.outcome_reason)
                raise RunCancelled(f"the run was cancelled: {job.outcome_reason}")
            raise PeerDropped(f"the job failed: {job.outcome_reason}")
        if party is None or party.end_delivered:  # tokens expire with the party's place in the job
            raise InvalidSignature(f"the session token for job {job_id!r} has expired: the job is over for this party")
        return job, party_id

    # --- RunEvents: what the jobs report, recorded in the store -------------------------------

    def joined(self, job: Run, party_id: str, rows: int) -> None:
        self.store.party(job.run_id, party_id, "joined", rows=rows)

    def left(self, job: Run, party_id: str) -> None:
        self.store.forget_party(job.run_id, party_id)

    def started(self, job: Run) -> None:
        self.store.set_state(job.run_id, "running")
        for pid in job.config.expected_parties:
            if pid not in job.parties and pid not in job.lobby.declined:
                self.store.party(job.run_id, pid, "never joined")

    def declined(self, job: Run, party_id: str, reason: str) -> None:
        self.store.party(job.run_id, party_id, "declined", reason=reason)

    def dropped(self, job: Run, party_id: str, reason: str) -> None:
        self.store.party(job.run_id, party_id, "dropped", reason=reason)
        self.phase_over(job)  # a checkpoint with the party in is untrue: gone before the next attempt goes out

    def step_done(self, job: Run, name: str, seconds: float, bytes_in: int, bytes_relayed: int) -> None:
        if self.metrics is not None:
            self.metrics.step(job.config.job_type, name, seconds, bytes_in, bytes_relayed)
        now = time.monotonic()
        if now - self._steps_saved.get(job.run_id, 0.0) >= STEPS_SAVE_SECONDS:
            self._steps_saved[job.run_id] = now
            self.store.set_steps(job.run_id, job.ledger.as_dict())

    def phase_over(self, job: Run) -> None:
        if self.checkpoints is not None:
            self.checkpoints.remove(job.run_id)

    def ended(self, job: Run) -> None:
        self.phase_over(job)
        if job.stage is Stage.CANCELLED:
            state = "interrupted" if self._shutting_down else "cancelled"
        else:
            state = job.stage.value
        by = self._cancelled_by.get(job.run_id, "") if state == "cancelled" else ""
        self.store.set_steps(job.run_id, job.ledger.as_dict(), job.privacy().get("line", ""))
        self.store.set_state(job.run_id, state, job.outcome_reason, cancelled_by=by)
        if job.config.summary_path is not None:  # the run summary the job file asks for (docs/design.md §9)
            write_json_atomic(job.config.summary_path, job.summary(), mode=0o644)
        if self.metrics is not None:
            self.metrics.sent(job.config.job_type, sum(s.bytes_out for s in job.ledger.steps.values()))
        log.info("job %s: run %s %s", job.config.job_id, job.run_id, state)
        self._advance(job.config.job_id)  # the job's next queued run, if any

    def _tick_loop(self) -> None:
        while not self._stop.wait(TICK_SECONDS):
            now = self._clock()
            with self._lock:
                live = [job for job in self.jobs.values() if not job.stage.ended]
            for job in live:
                try:
                    job.tick(now)
                except Exception:  # a bug in one job must not stop the others' deadlines
                    log.exception("job %s: deadline handling failed", job.config.job_id)


SUBMITTED = "submitted"
STEPS_SAVE_SECONDS = 2.0  # how often a running run's step timings reach the store

