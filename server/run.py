"""One run of a job on the coordinator: the engine that runs a job's phases (docs/architecture.md).

    JOINING --all expected joined, or the join deadline with >= min_parties--> SETUP
    JOINING --join deadline with fewer--> FAILED;  the joined data cannot run the job--> FAILED (REFUSED)
    SETUP   the seed phase (server/phases/seed.py) --> RUNNING
    RUNNING the moments phase if the job prepares (server/phases/prepare.py), then the job type's
            program (CoordinatorJob.program) --it returns--> DONE;  a phase fails--> FAILED
    any     --active parties < min_parties--> FAILED;  --`cancel`--> CANCELLED

Every transition is one method call under the run's lock: `join`, `message` (a complete,
validated payload from an authenticated party), `disconnected` (its Pull stream ended) and `tick`
(deadlines). The run owns the parties and their mailboxes, the step in flight, deadlines, drops
and the ledger of seconds and bytes; what a step means belongs to the phase that started it. A
party that disconnects is dropped from the job; one that misses a deadline is dropped too, or,
in a scope that says so (a training round), only leaves that scope. It relays peer-addressed
payloads of phases that carry them without reading them, and logs sizes and timings, never payloads or keys.
"""

from __future__ import annotations

import inspect
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from xclp.crypto.identity import KeyBundle, SignedBundle
from xclp.data.prep import Scaling
from xclp.errors import InvalidInput, NotAuthorized, ProtocolError, XclpError
from xclp.server import limits, liveness
from xclp.server.admission import STATUS_SECONDS, Lobby
from xclp.server.config import JobConfig
from xclp.server.events import Observer, RunEvents, Stage
from xclp.server.jobs.base import CoordinatorJob
from xclp.server.jobs.summary import StepLedger, log_line, run_summary
from xclp.server.mailbox import Party, Post
from xclp.server.phases.base import Activity, Phase, PhaseFailed, Program, Scope, Step
from xclp.server.phases.prepare import prepare
from xclp.server.phases.seed import SeedPhase
from xclp.v1 import registry, wire
from xclp.v1 import xclp_pb2 as pb
from xclp.v1.spec import party_view
from xclp.v1.steps import ALIVE_MSG, LEAVE_MSG
from xclp.workers import DaskWorkers

log = logging.getLogger("xclp.server")

class Run:
    def __init__(self, config: JobConfig, allow_list: Mapping[str, bytes], *,
                 clock: Callable[[], float] = time.monotonic, observer: Observer | None = None,
                 job: CoordinatorJob[Any] | None = None) -> None:
        """`job`: the job type's logic, by default what the registry makes for config.job_type."""
        self.config, self.allow_list, self.clock, self.observer = config, allow_list, clock, observer
        self.job: CoordinatorJob[Any] = (job if job is not None
                                         else registry.get(config.job_type).coordinator_class()(config))
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)  # notified when a step starts or a scope loses a member
        self.stage = Stage.JOINING
        self.lobby = Lobby(config, allow_list, clock, self.job.check_summary)
        self.run_nonce = self.lobby.run_nonce
        self.parties: dict[str, Party] = self.lobby.parties
        self.active: list[str] = []  # roster members not dropped, sorted
        self.dropped: set[str] = set()
        self.drop_reasons: dict[str, str] = {}
        self._root: Scope | None = None  # the job's scope, once the roster is out
        self.phase: Phase | None = None
        self.step: Step | None = None
        self.activity = Activity()  # what job show says it does now: read without the lock
        # wire names of steps that ran -> the largest message they took: a payload for one is late
        self.past_steps: dict[str, int] = {}
        self.last_attempt: Step | None = None  # the step attempt that ended last (a restart's predecessor)
        self.closed_scopes: set[str] = set()  # prefixes of scopes that are over (training rounds)
        self.session_id, self.run_id = b"", ""  # set when the roster goes out; the coordinator's id of this run
        self.events: RunEvents | None = None
        self.ledger = StepLedger()  # seconds and bytes of every step, for the operator
        self.scaling: Scaling | None = None  # docs/design.md §8: the pooled preparation, if the job prepares
        self.outcome_reason, self.started_at = "", clock()
        self.offload: DaskWorkers | None = None  # the operator's cluster for the influence solve (server/offload.py)
        self.done_event = threading.Event()
        self.post = Post(config.job_id, self.parties)
        self._program: Program[str] | None = None

    # --- what the parties and the operator see ----------------------------------------------------

    def challenge(self, party_id: str) -> pb.ChallengeResponse:
        """The run's nonce and spec for an expected party: nobody else learns the parameters, the
        expected parties or any data set name (docs/design.md §2.5)."""
        if party_id not in self.config.expected_parties:
            raise NotAuthorized(f"party {party_id!r} is not expected in job {self.config.job_id!r}")
        return pb.ChallengeResponse(run_nonce=self.run_nonce, spec=party_view(self.config.spec(), party_id),
                                    run_id=self.run_id)

    @property
    def table_dim(self) -> int:  # feature columns of the parties' tables (their data summaries agree)
        return int(next(iter(self.parties.values())).summary.dim)

    @property
    def scope(self) -> Scope:
        """The job's scope: every party on the roster and not dropped, the run's session id."""
        if self._root is None:
            raise ProtocolError(f"job {self.config.job_id!r} has no roster yet")
        return self._root

    @property
    def dim(self) -> int:  # feature columns the job's phases work on: less those the preparation dropped (§8)
        return self.scaling.dim if self.scaling is not None else self.table_dim

    # --- transitions --------------------------------------------------------------------------

    def decline(self, party_id: str, run_nonce: bytes, reason: pb.DeclineRequest.Reason) -> None:
        """An expected party will not join (its call verified): go on without it, or fail if the rest are too few."""
        with self.lock:
            if self.stage is not Stage.JOINING:
                raise ProtocolError(f"job {self.config.job_id!r} is past admission")
            why = self.lobby.decline(party_id, run_nonce, reason)
            if self.events is not None:
                self.events.declined(self, party_id, why)
            if self.lobby.possible < self.config.min_parties:
                declined = ", ".join(f"{p} ({w})" for p, w in sorted(self.lobby.declined.items()))
                self._fail(f"{declined}: at most {self.lobby.possible} of the {self.config.min_parties} required "
                           "parties can join")
            elif self.lobby.full:
                self._start()
            else:
                self.lobby.status(self.clock())  # the others hear they no longer wait for it

    def join(self, signed: SignedBundle, summary: pb.DataSummary, capabilities: frozenset[str] = frozenset()) \
            -> KeyBundle:
        with self.lock:
            closed = f"its run {self.run_id} {self.stage.value}: {self.outcome_reason}" if self.stage.ended else ""
            party = self.lobby.admit(signed, summary, open_=self.stage is Stage.JOINING, closed=closed)
            party.capabilities = capabilities
            party.mailbox.keeps_sent = liveness.may_reconnect(party, self.config.reconnect_seconds)
            if self.events is not None:
                self.events.joined(self, party.bundle.party_id, int(summary.rows))
            if self.lobby.full:
                self._start()
            else:
                self.lobby.status(self.clock())
            return party.bundle

    def message(self, sender: str, msg: wire.Message) -> None:
        """A complete payload from an authenticated party: a contribution, a relay, a progress report or
        its leave."""
        if msg.step == ALIVE_MSG and sender in self.parties:  # no lock: two fields of the party's
            return liveness.report(self.parties[sender], msg.payload, self.clock())
        if msg.step == LEAVE_MSG and sender in self.parties:
            return self.disconnected(sender, None, liveness.reason(msg.payload))
        with self.lock:
            if sender not in self.active:
                raise ProtocolError(f"party {sender!r} takes no part in job {self.config.job_id!r} now")
            step, phase = self.step, self.phase
            if step is None or phase is None or msg.step != step.wire:
                if limits.late(self, sender, msg.step):
                    log.info("job %s: ignoring a late %s payload from %s", self.config.job_id, msg.step, sender)
                    return
                current = step.wire if step else self.stage.value
                raise InvalidInput(f"step {msg.step!r} is not running (job {self.config.job_id!r} is at {current!r})")
            if msg.round < step.attempt or sender not in phase.scope.members:
                log.info("job %s: ignoring a late %s attempt %d payload from %s", self.config.job_id, msg.step,
                         msg.round, sender)
                return
            if msg.round > step.attempt:
                raise InvalidInput(f"round {msg.round} of step {msg.step!r} has not started (current: {step.attempt})")
            if sender not in step.participants:
                raise ProtocolError(f"party {sender!r} is not a participant of step {step.wire!r} round {step.attempt}")
            if msg.recipient:  # a peer's message, relayed unread
                phase.check_relay(step, sender, msg.recipient, msg.payload)
                step.check_relay(sender, msg.recipient, phase.relay_limit(step, sender, msg.recipient))
                self.post.relay(sender, msg)
                step.relays[(sender, msg.recipient)] += 1
                step.bytes_relayed += msg.nbytes
                step.largest = max(step.largest, msg.nbytes)
                return
            if sender not in step.pending:
                raise InvalidInput(f"party {sender!r} already contributed to step {step.wire!r} round {step.attempt}")
            phase.accept(step, sender, msg.payload)
            if self.observer is not None:
                self.observer(self.config.job_id, step.wire, step.attempt, sender, msg.payload)
            step.bytes_in += msg.nbytes
            step.largest = max(step.largest, msg.nbytes)
            if phase.owes(step, sender):  # a piece: more to come from this sender
                return
            step.received[sender] = msg.payload
            step.pending.discard(sender)
            if not step.pending:
                self.end_step(step)
                phase.on_step_complete(step)

    def disconnected(self, party_id: str, stream: int | None = None, reason: str = "") -> None:
        """The party's Pull `stream` ended (if no other took over), or the party left (`reason`)."""
        with self.lock:
            party = self.parties.get(party_id)
            if party is None or party.ended or self.stage.ended or stream not in (None, party.mailbox.stream):
                return
            if not reason and liveness.may_reconnect(party, self.config.reconnect_seconds):
                party.lost_at = self.clock()  # in the lobby too: a wait for the others can be long
                log.warning("job %s: lost the connection to %s; it has %g s to reconnect", self.config.job_id,
                            party_id, self.config.reconnect_seconds)
            elif self.stage is Stage.JOINING:
                self._leave_lobby(party_id)
            else:
                self._drop({party_id}, reason or "disconnected")

    def restarted(self, party_id: str, refused: str = "") -> None:
        """The party's process restarted (liveness.attach): its step again with it (Phase.on_restarted), or a drop."""
        step, phase, where = self.step, self.phase, self.step.wire if self.step else self.stage.value
        if party_id in self.active and (refused or step is None or phase is None or step.ended or party_id not in
                                        step.participants or not phase.on_restarted(step, party_id)):
            self._drop({party_id}, refused or f"its process restarted in {where!r}, which a party cannot rejoin "
                                              "(only SecureHamming, update sums and SecureRowSums do)")

    def tick(self, now: float) -> None:
        with self.lock:
            if self.stage is Stage.JOINING:
                for pid in liveness.gone(self.parties, list(self.parties), now, self.config.reconnect_seconds):
                    self._leave_lobby(pid)
                if now >= self.lobby.deadline:
                    if len(self.parties) >= self.config.min_parties:
                        log.info("job %s: join deadline passed; starting with %d parties", self.config.job_id,
                                 len(self.parties))
                        self._start()
                    else:
                        self._fail(f"only {len(self.parties)} of the {self.config.min_parties} required parties "
                                   "joined in time")
                elif now - self.lobby.status_at >= STATUS_SECONDS:
                    self.lobby.status(now)
            elif self.config.max_run_seconds and now - self.started_at >= self.config.max_run_seconds:
                self._fail(f"the run took longer than its max_run_seconds = {self.config.max_run_seconds:g}")
            elif not self.stage.ended:
                if gone := liveness.gone(self.parties, self.active, now, self.config.reconnect_seconds):
                    return self._drop(gone, f"disconnected, and did not reconnect within "
                                            f"{self.config.reconnect_seconds:g} s")
                liveness.news(self.parties, now, self.started_at, self.activity.step)
                if self.step is None or self.phase is None or not (
                        late := liveness.late(self.step, self.phase, self.parties, now, self.config.step_seconds)):
                    return
                reason = f"sent nothing for {self.config.step_seconds:g} s in step {self.step.wire!r}, which waited"
                (self._leave if self.phase.scope.leave_on_deadline else self._drop)(late, reason)

    def cancel(self, reason: str, *, interrupted: bool = False) -> None:
        """End the run now (the operator's `job cancel`, or, `interrupted`, the coordinator shutting down)."""
        with self.lock:
            if self.stage.ended:
                raise InvalidInput(f"run {self.run_id or self.config.job_id} is already {self.stage.value}")
            self._settle(Stage.CANCELLED, reason, pb.JobEnd.INTERRUPTED if interrupted else pb.JobEnd.CANCELLED,
                         self.parties)
            log.warning("job %s: run %s cancelled: %s", self.config.job_id, self.run_id, reason)

    def payload_limit(self, sender: str, step: str, recipient: str, attempt: int | None = None) -> int:
        return limits.payload_limit(self, sender, step, recipient, attempt)  # (server/limits.py)

    # --- for phases and programs --------------------------------------------------------------

    def start_step(self, scope: Scope, name: str, participants: Iterable[str], attempt: int) -> Step:
        members = tuple(sorted(participants))
        if self.step is not None:
            self.end_step(self.step)
        now = self.clock()
        self.step = step = Step(name, scope.wire(name), attempt, members, now, set(members))
        self.activity = Activity(step.wire, attempt)
        start = pb.StepStart(step=step.wire, round=attempt, participants=list(members),
                             deadline_seconds=self.config.step_seconds)
        for pid in members:
            self.parties[pid].mailbox.put(pb.PullItem(step=start))
        self.changed.notify_all()
        log.info("job %s: step %s attempt %d started with %d parties", self.config.job_id, step.wire, attempt,
                 len(members))
        return step

    def end_step(self, step: Step) -> None:
        """`step` is over (complete, or given up for another): its seconds and bytes go to the ledger."""
        if step.ended:
            return
        how = "given up" if step.pending else "complete"
        step.ended = True
        if self.activity.step == step.wire:
            self.activity = Activity()
        self.past_steps[step.wire] = max(self.past_steps.get(step.wire, 0), limits.late_bound(step, self.phase))
        self.last_attempt = step
        seconds = self.clock() - step.started
        self.ledger.record(step.name, seconds, bytes_in=step.bytes_in, bytes_relayed=step.bytes_relayed)
        if self.events is not None:
            self.events.step_done(self, step.name, seconds, step.bytes_in, step.bytes_relayed)
        log.info("job %s: step %s attempt %d %s in %.3fs; %d parties, %d bytes in, %d bytes relayed",
                 self.config.job_id, step.wire, step.attempt, how, seconds, len(step.participants), step.bytes_in,
                 step.bytes_relayed)

    def report(self, describe: Callable[[], str], *, work: str = "") -> None:
        """How far the current step, or the coordinator's own `work` between steps, has got."""
        step = self.step
        self.activity = (Activity(work, 0, describe) if work or step is None
                         else Activity(step.wire, step.attempt, describe))

    def send(self, party_id: str, wire_name: str, attempt: int, payload: wire.Payload, *, ledger_name: str) -> int:
        """Queue a coordinator payload (sender "") for a party; returns the bytes queued."""
        size = self.post.send(party_id, wire_name, attempt, payload)
        self.ledger.sent(ledger_name, size)
        return size

    def open_scope(self, prefix: str, session: bytes, members: Iterable[str], *, leave_on_deadline: bool) -> Scope:
        return Scope(self, prefix, session, [p for p in members if p in self.active],
                     min_members=self.config.min_parties, leave_on_deadline=leave_on_deadline)

    def close_scope(self, scope: Scope) -> None:  # a scope is over: what its parties still push for it is late
        if scope.prefix:
            self.closed_scopes.add(scope.prefix)

    def resume(self, phase: Phase, result: Any = None, *, error: PhaseFailed | None = None) -> None:
        """`phase` is done (or failed): the program goes on to its next phase, or ends."""
        if phase is not self.phase or self._program is None or self.stage.ended:
            return
        if self.step is not None:
            self.end_step(self.step)
        self.step = self.phase = None
        self.checkpoint_stale()  # a checkpoint of the phase that ended is no longer true
        try:
            following = self._program.throw(error) if error is not None else self._program.send(result)
        except StopIteration as stop:
            self._finish(stop.value or "")
        except PhaseFailed as exc:
            self._fail(exc.reason, exc.outcome)
        except XclpError as exc:  # out-of-range values, nothing left to propagate, ...: no restart fixes it
            self._fail(str(exc))
        else:
            self.phase = following
            following.start()

    def checkpoint_stale(self) -> None:  # its checkpoint (server/resume.py), if any, no longer says where it is
        if self.events is not None:
            self.events.phase_over(self)

    # --- internals ----------------------------------------------------------------------------

    def _lifecycle(self) -> Program[str]:
        """What every job runs: the seed, the preparation if asked for, then the job's own phases."""
        assert self._root is not None
        yield SeedPhase(self._root)
        self.stage = Stage.RUNNING
        if self.config.params.prepares:
            self.scaling = yield from prepare(self._root, self.config.params, self.table_dim, self.job.check_prepared)
        return (yield from self.job.program(self))

    def _start(self) -> None:
        try:
            self.job.check_start(self.parties)
        except InvalidInput as exc:
            self._fail(str(exc), pb.JobEnd.REFUSED)
            return
        self.active = sorted(self.parties)
        self.session_id = self.lobby.send_roster()
        self.dropped.update(p for p in self.config.expected_parties if p not in self.parties)  # never joined
        self.stage = Stage.SETUP
        if self.events is not None:
            self.events.started(self)
        self._root = Scope(self, "", self.session_id, self.active, min_members=self.config.min_parties)
        self._program = self._lifecycle()
        self.phase = next(self._program)
        self.phase.start()

    def start_restored(self, members: list[str], program: Callable[[], Program[str]]) -> None:
        """Go on with a run a restarted coordinator read back (server/resume.py): the roster is out
        and the parties are in; `program` gives the rest of the job's program from its saved phase."""
        self.stage = Stage.RUNNING
        self._root = Scope(self, "", self.session_id, members, min_members=self.config.min_parties)
        self._program = program()
        self.phase = next(self._program)
        self.phase.start()

    def _leave_lobby(self, party_id: str) -> None:
        self.lobby.leave(party_id)
        if self.events is not None:
            self.events.left(self, party_id)

    def _drop(self, parties: set[str], reason: str) -> None:
        """Drop `parties` from the job: they hear why and take no further part."""
        parties = {p for p in parties if p in self.active}
        for pid in sorted(parties):
            self.active.remove(pid)
            self.dropped.add(pid)
            self.drop_reasons[pid] = reason
            self._end(pid, pb.JobEnd.DROPPED, reason)
            if self.events is not None:
                self.events.dropped(self, pid, reason)
            log.warning("job %s: dropped %s (%s)", self.config.job_id, pid, reason)
        if parties and len(self.active) < self.config.min_parties:
            self._fail(f"{len(self.active)} parties left, fewer than min_parties = {self.config.min_parties}")
        elif parties:
            if self._root is not None and self.phase is not None and self.phase.scope is not self._root:
                self._root.members = [p for p in self._root.members if p not in parties]
            self._leave(parties, reason)

    def _leave(self, parties: set[str], reason: str) -> None:
        """`parties` leave the current phase's scope; the phase decides how its step goes on."""
        phase, step = self.phase, self.step
        if phase is None:
            return
        scope, gone = phase.scope, parties & set(phase.scope.members)
        if not gone:
            return
        if scope is not self._root:
            log.warning("job %s: %s goes on without %s (%s)", self.config.job_id, scope.prefix.rstrip("."),
                        ", ".join(sorted(gone)), reason)
        scope.members = [p for p in scope.members if p not in gone]
        self.changed.notify_all()
        if len(scope.members) < scope.min_members:
            phase.fail(f"only {len(scope.members)} of its parties are left")
        elif step is not None and not step.ended and gone & set(step.participants):
            phase.on_dropped(step, gone & set(step.participants))
        elif step is None:  # the coordinator's own work between steps (a Work phase)
            phase.on_left(gone)

    def _finish(self, reason: str) -> None:
        log.info("job %s: done in %.3fs with %d parties", self.config.job_id, self.clock() - self.started_at,
                 len(self.active))
        self._settle(Stage.DONE, reason, pb.JobEnd.DONE, self.active)

    def _fail(self, reason: str, outcome: pb.JobEnd.Outcome = pb.JobEnd.FAILED) -> None:
        log.error("job %s: failed: %s", self.config.job_id, reason)
        self._settle(Stage.FAILED, reason, outcome, self.parties)  # joined parties too, before the roster

    def _settle(self, stage: Stage, reason: str, outcome: pb.JobEnd.Outcome, told: Iterable[str]) -> None:
        """The run is over: no step runs (a late payload of the last one is ignored), `told` hear why."""
        self.stage, self.outcome_reason = stage, reason
        if self.step is not None:
            self.end_step(self.step)
        self.step = self.phase = None
        if self._program is not None and inspect.getgeneratorstate(self._program) != inspect.GEN_RUNNING:
            self._program.close()
        try:
            log.info("job %s: %s", self.config.job_id, log_line(self.summary()))
            if self.events is not None:  # stored before anyone hears: a party told the run is over finds it so
                self.events.ended(self)
        finally:
            for pid in list(told):
                self._end(pid, outcome, reason or "job complete")
            self.done_event.set()

    def _end(self, party_id: str, outcome: pb.JobEnd.Outcome, reason: str) -> None:
        party = self.parties[party_id]
        if not party.ended:
            party.ended = True
            party.mailbox.put(pb.PullItem(end=pb.JobEnd(outcome=outcome, reason=reason)))

    def summary(self) -> dict[str, Any]:  # the run summary (docs/design.md §9, server/jobs/summary.py)
        return run_summary(self)

    def privacy(self) -> dict[str, Any]:  # the run's privacy report (server/jobs/summary.py)
        return run_summary(self, privacy_only=True)
