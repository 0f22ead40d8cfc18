"""The coordinator's side of every job: an explicit state machine (STYLE §3, DESIGN §3–§4).

Lifecycle (`Stage`):

    JOINING --all expected joined, or join deadline with >= min_parties--> SETUP
    JOINING --join deadline with fewer--------------------------------------> FAILED
    JOINING --the joined parties' data cannot run the job (`check_start`)----> FAILED, parties REFUSED
    SETUP   (step "seed": the leader relays the sealed common seed, every party acks)
            --all acked--> RUNNING (the job type's first step)
            --leader dropped--> SETUP again, next round, next-smallest id leads
    RUNNING, if the job standardises or imputes (DESIGN §8): step "moments" (masked sums of
            (n, Σx, Σx²) per feature) --> "moments_reveal" --> message "moments_result" to every
            participant --> the job type's first step; a drop during "moments" restarts it
    RUNNING (job-specific steps) --last step complete--> DONE
    any     --active parties < min_parties--> FAILED
    any     --`cancel` (the operator, or the coordinator shutting down)--> CANCELLED

Every transition is one method call made under the job's lock: `join`, `message` (a complete,
validated payload from an authenticated party), `disconnected` (its Pull stream ended) and
`tick` (deadlines). A party that disconnects or misses a step's deadline is dropped and the job
type decides how the step goes on (`on_dropped`). The coordinator relays peer-addressed payloads
of steps that allow it without interpreting them, and logs each step's duration and bytes, never
payloads or keys.
"""

from __future__ import annotations

import enum
import hmac
import itertools
import logging
import secrets
import threading
import time
from collections.abc import Callable, Mapping
from typing import ClassVar, Protocol

from xclp.crypto.identity import KeyBundle, SignedBundle, session_id, verify_bundle
from xclp.errors import InvalidInput, NotAuthorized, ProtocolError, ReplayRefused, ResourceExhausted
from xclp.prep import Scaling
from xclp.server.config import JobConfig
from xclp.server.jobs.state import Party, Step, check_reveal, open_sum, ring_array
from xclp.server.jobs.summary import StepLedger
from xclp.v1 import moments, wire
from xclp.v1 import xclp_pb2 as pb
from xclp.v1.double_masking import REVEAL_BYTES, REVEAL_SUFFIX
from xclp.v1.jobs import params_json
from xclp.v1.steps import MOMENTS_RESULT_MSG, MOMENTS_STEP, SEED_STEP
from xclp.v1.wire import MAX_DIM

log = logging.getLogger("xclp.server")

STATUS_SECONDS = 60.0  # how often waiting parties hear how the join is going
MAILBOX_MAX_BYTES = 512 * 1024 * 1024  # relayed bytes waiting for one party
MAX_PUSH_STREAMS = 4  # Push calls one party may have open at once
SEED_RELAY_MAX_BYTES = 1024  # a sealed 32-byte seed is 60 bytes
# Called with (job_id, step, round, sender, payload) for every contribution; tests only.
Observer = Callable[[str, str, int, str, wire.Payload], None]


class Stage(enum.Enum):
    JOINING = "joining"
    SETUP = "setup"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def ended(self) -> bool:
        return self in (Stage.DONE, Stage.FAILED, Stage.CANCELLED)


class RunEvents(Protocol):
    """What the coordinator's run registry hears of a job (server/runs.py): called under the job's
    lock, so each must be quick; none carries data, keys or masks."""

    def joined(self, job: Job, party_id: str, rows: int) -> None: ...
    def left(self, job: Job, party_id: str) -> None: ...
    def started(self, job: Job) -> None: ...
    def dropped(self, job: Job, party_id: str, reason: str) -> None: ...
    def step_done(self, job: Job, name: str, seconds: float, bytes_in: int, bytes_relayed: int) -> None: ...
    def ended(self, job: Job) -> None: ...


class Job:
    """Base state machine; job types implement `begin`, `accept`, `on_step_complete`, `on_dropped`."""

    job_type: ClassVar[str] = ""
    # Steps whose payloads parties may address to each other (relayed, never opened).
    relay_steps: ClassVar[frozenset[str]] = frozenset({SEED_STEP})

    def __init__(self, config: JobConfig, allow_list: Mapping[str, bytes], *,
                 clock: Callable[[], float] = time.monotonic, observer: Observer | None = None) -> None:
        self.config = config
        self.allow_list = allow_list
        self.clock = clock
        self.observer = observer
        self.lock = threading.RLock()
        self.stage = Stage.JOINING
        self.parties: dict[str, Party] = {}
        self.active: list[str] = []  # roster members not dropped, sorted
        self.dropped: set[str] = set()
        self.drop_reasons: dict[str, str] = {}
        self.step: Step | None = None
        # Steps that ran and are over: a party may still push for them (e.g. a relay resent in a
        # restarted round that completed from cached results); such payloads are late, not bad.
        self.past_steps: set[str] = set()
        self.join_deadline = clock() + config.join_seconds
        # Every key bundle of this run signs it (DESIGN §2.1): a bundle of an earlier run is refused.
        self.run_nonce = secrets.token_bytes(16)
        self.session_id = b""  # set when the roster goes out
        self._status_at = clock()  # when the last JoinStatus went out
        self.started_at = clock()
        self.outcome_reason = ""
        self._message_ids = itertools.count(1)
        self.done_event = threading.Event()
        self.run_id = ""  # the coordinator's id of this run (server/runs.py)
        self.events: RunEvents | None = None
        # seconds and bytes of every step of the run, for the operator (`xclp-server job show`)
        self.run_ledger = StepLedger()
        # DESIGN §8: the pooled preparation, once the moments step has run (None: the job does not prepare)
        self.scaling: Scaling | None = None
        self._moments: Step | None = None  # the complete moments round whose self masks are revealed

    # --- spec -------------------------------------------------------------------------------

    def challenge(self) -> pb.ChallengeResponse:
        return pb.ChallengeResponse(run_nonce=self.run_nonce, spec=self.spec(), run_id=self.run_id)

    def spec(self) -> pb.JobSpec:
        c = self.config
        return pb.JobSpec(job_id=c.job_id, job_type=c.job_type, params_json=params_json(c.params),
                          expected_parties=list(c.expected_parties), min_parties=c.min_parties,
                          step_deadline_seconds=c.step_seconds, datasets=c.datasets)

    @property
    def dim(self) -> int:
        """Feature columns the job's steps work on: the parties' columns, less those the
        preparation dropped (DESIGN §8)."""
        if self.scaling is not None:
            return self.scaling.dim
        return self.table_dim

    @property
    def table_dim(self) -> int:
        """Feature columns of the parties' tables (their data summaries agree)."""
        return int(next(iter(self.parties.values())).summary.dim)

    # --- transitions ----------------------------------------------------------------------------

    def join(self, signed: SignedBundle, summary: pb.DataSummary) -> KeyBundle:
        """Admit a party: allow-listed, expected, correctly signed, data summary consistent."""
        with self.lock:
            try:
                claimed = KeyBundle.from_bytes(signed.bundle)
            except InvalidInput as exc:
                raise InvalidInput(f"malformed key bundle: {exc}") from None
            allowed = self.allow_list.get(claimed.party_id)
            if allowed is None:
                raise NotAuthorized(f"party {claimed.party_id!r} is not on the coordinator's allow-list")
            self.check_claimed_bundle(claimed)
            if claimed.party_id not in self.config.expected_parties:
                raise NotAuthorized(f"party {claimed.party_id!r} is not expected in job {self.config.job_id!r}")
            bundle = verify_bundle(signed, expected_identity=allowed)
            if bundle.job_id != self.config.job_id:
                raise InvalidInput(f"the key bundle is for job {bundle.job_id!r}, not {self.config.job_id!r}")
            if not hmac.compare_digest(bundle.nonce, self.run_nonce):
                raise ReplayRefused(f"the key bundle of {bundle.party_id!r} signs another run's nonce (replayed or "
                                    f"stale): ask for this run's challenge and sign a fresh bundle")
            if self.stage is not Stage.JOINING:
                raise ProtocolError(f"job {self.config.job_id!r} is past admission ({self.stage.value})")
            if bundle.party_id in self.parties:
                raise ProtocolError(f"party {bundle.party_id!r} has already joined job {self.config.job_id!r}")
            self.check_summary(summary)
            self.parties[bundle.party_id] = Party(bundle, signed, summary)
            if self.events is not None:
                self.events.joined(self, bundle.party_id, int(summary.rows))
            log.info("job %s: %s joined (%d/%d)", self.config.job_id, bundle.party_id,
                     len(self.parties), len(self.config.expected_parties))
            if len(self.parties) == len(self.config.expected_parties):
                self._start()
            else:
                self._join_status(self.clock())
            return bundle

    def message(self, sender: str, msg: wire.Message) -> None:
        """A complete payload from an authenticated party: a contribution or a relay."""
        with self.lock:
            if sender not in self.active:
                raise ProtocolError(f"party {sender!r} takes no part in job {self.config.job_id!r} now")
            step = self.step
            if step is None or msg.step != step.name:
                if msg.step in self.past_steps:
                    log.info("job %s: ignoring a late %s payload from %s; that step is over", self.config.job_id,
                             msg.step, sender)
                    return
                current = step.name if step else self.stage.value
                raise InvalidInput(f"step {msg.step!r} is not running (job {self.config.job_id!r} is at {current!r})")
            if msg.round < step.round:
                log.info("job %s: ignoring a late %s round %d payload from %s", self.config.job_id,
                         msg.step, msg.round, sender)
                return
            if msg.round > step.round:
                raise InvalidInput(f"round {msg.round} of step {msg.step!r} has not started (current: {step.round})")
            if sender not in step.participants:
                raise ProtocolError(f"party {sender!r} is not a participant of step {step.name!r} round {step.round}")
            if msg.recipient:
                self._relay(step, sender, msg)
                return
            if sender not in step.pending:
                raise InvalidInput(f"party {sender!r} already contributed to step {step.name!r} round {step.round}")
            if step.name == SEED_STEP:
                if msg.payload != b"":
                    raise InvalidInput("the seed step's acknowledgement must be an empty payload")
            elif step.name == MOMENTS_STEP:
                dtype, shape = moments.wire(self.table_dim)
                ring_array(msg.payload, dtype, shape, f"the masked moments from {sender!r}")
            elif step.name == moments.REVEAL_STEP:
                check_reveal(msg.payload, self.session_id, MOMENTS_STEP, step, sender)
            else:
                self.accept(step, sender, msg.payload)
            if self.observer is not None:
                self.observer(self.config.job_id, step.name, step.round, sender, msg.payload)
            step.received[sender] = msg.payload
            step.pending.discard(sender)
            step.bytes_in += msg.nbytes
            if not step.pending:
                self._complete(step)

    def disconnected(self, party_id: str) -> None:
        with self.lock:
            party = self.parties.get(party_id)
            if party is None or party.ended or self.stage.ended:
                return
            if self.stage is Stage.JOINING:
                # Not yet on a roster: forget it, it may join again with fresh keys.
                del self.parties[party_id]
                if self.events is not None:
                    self.events.left(self, party_id)
                log.info("job %s: %s left before the roster was sent", self.config.job_id, party_id)
                return
            self._drop({party_id}, "disconnected")

    def tick(self, now: float) -> None:
        with self.lock:
            if self.stage is Stage.JOINING and now < self.join_deadline and now - self._status_at >= STATUS_SECONDS:
                self._join_status(now)
            if self.stage is Stage.JOINING and now >= self.join_deadline:
                if len(self.parties) >= self.config.min_parties:
                    log.info("job %s: join deadline passed; starting with %d parties", self.config.job_id,
                             len(self.parties))
                    self._start()
                else:
                    self._fail(f"only {len(self.parties)} of the {self.config.min_parties} required parties joined in time")
            elif self.step is not None and self.stage in (Stage.SETUP, Stage.RUNNING) and now >= self.step.deadline:
                self._drop(self.blame(self.step), f"missed the deadline of step {self.step.name!r}")

    # --- hooks for job types ----------------------------------------------------------------

    def blame(self, step: Step) -> set[str]:
        """Who is dropped when `step` misses its deadline: those who still owe a contribution,
        except that in the seed step a silent leader alone is to blame (the others wait for it)."""
        if step.name == SEED_STEP and step.participants[0] in step.pending:
            return {step.participants[0]}
        return set(step.pending)

    def payload_limit(self, sender: str, step: str, recipient: str) -> int:
        """The most bytes one message of `step` from `sender` can need (checked before buffering)."""
        if step == SEED_STEP:
            return SEED_RELAY_MAX_BYTES
        if step == MOMENTS_STEP:
            dtype, shape = moments.wire(self.table_dim)
            return dtype.itemsize * shape[0] * shape[1] * shape[2]
        if step.endswith(REVEAL_SUFFIX):
            return REVEAL_BYTES
        return wire.DEFAULT_MAX_PAYLOAD_BYTES

    def check_claimed_bundle(self, claimed: KeyBundle) -> None:
        """Refuse an allow-listed party's bundle whose keys this job cannot use (checked before its signature)."""

    def check_summary(self, summary: pb.DataSummary) -> None:
        if summary.rows < 1 or summary.dim < 1:
            raise InvalidInput("the data summary must report at least one row and one column")
        if summary.rows > self.config.max_rows_per_party:
            raise InvalidInput(f"the data summary reports {summary.rows} rows; job {self.config.job_id!r} takes at "
                               f"most {self.config.max_rows_per_party} per party (max_rows_per_party)")
        cap = self.config.max_total_rows
        joined = sum(int(p.summary.rows) for p in self.parties.values())
        if cap and joined + summary.rows > cap:
            raise ResourceExhausted(f"job {self.config.job_id!r} takes at most {cap} rows in all (max_total_rows); "
                                    f"{joined} have joined and this party brings {summary.rows}: subsample, or ask "
                                    "the operator to raise the cap if the coordinator has the memory")
        if summary.dim > MAX_DIM:
            raise InvalidInput(f"the data summary reports {summary.dim} columns; at most {MAX_DIM}")
        if summary.labeled_rows > summary.rows:
            raise InvalidInput("the data summary reports more labeled rows than rows")
        for pid, other in self.parties.items():
            if other.summary.dim != summary.dim:
                raise InvalidInput(f"data has {summary.dim} columns but {pid!r} has {other.summary.dim}; all parties must agree")
            if other.summary.schema and summary.schema and other.summary.schema != summary.schema:
                raise InvalidInput(f"the data's feature columns have other names, or another order, than those of "
                                   f"{pid!r}; every party needs the same feature columns in the same order")

    def check_start(self) -> None:
        """Raise InvalidInput if the joined parties' data cannot run this job (checked before any work)."""

    def check_prepared(self) -> None:
        """Raise InvalidInput if the data, as prepared (`self.dim` features), cannot run this job."""

    def begin(self) -> None:
        """SETUP is over: start the first job-specific step (`start_step`)."""
        raise NotImplementedError

    def accept(self, step: Step, sender: str, payload: wire.Payload) -> None:
        """Validate a contribution to `step` (raise InvalidInput); the base then records it."""
        raise NotImplementedError

    def on_step_complete(self, step: Step) -> None:
        raise NotImplementedError

    def on_dropped(self, step: Step, dropped: set[str]) -> None:
        """Participants of the running job-specific step dropped; the job has >= min_parties left.
        (A drop in a reveal step never gets here: the base fails the job, DESIGN §6.1.)"""
        raise NotImplementedError

    def wire_name(self, name: str) -> str:
        """The name a step or message has on the wire (a federated round scopes its names, xclp.v1.fedavg)."""
        return name

    def on_reveal_lost(self, step: Step, dropped: set[str]) -> None:
        """A participant of the reveal step `step` dropped: DESIGN §6.1, the others revealed their seeds
        and mask no other round of the step, so the aggregate is lost; by default the job fails."""
        masked = step.name.removesuffix(REVEAL_SUFFIX)
        self._fail(f"{', '.join(sorted(dropped))} dropped while revealing self masks; the {masked!r} "
                   "aggregate cannot be released (DESIGN §6.1)")

    # --- helpers for job types --------------------------------------------------------------

    def start_step(self, name: str, participants: list[str] | None = None, round: int | None = None) -> Step:
        members = tuple(sorted(self.active if participants is None else participants))
        if round is None:
            round = self.step.round + 1 if self.step is not None and self.step.name == name else 0
        if self.step is not None:
            self.past_steps.add(self.step.name)
        now = self.clock()
        step = Step(name, round, members, now, now + self.config.step_seconds, set(members))
        self.step = step
        start = pb.StepStart(step=self.wire_name(name), round=round, participants=list(members),
                             deadline_seconds=self.config.step_seconds)
        for pid in members:
            self.parties[pid].mailbox.put(pb.PullItem(step=start))
        log.info("job %s: step %s round %d started with %d parties", self.config.job_id, name, round, len(members))
        return step

    def send(self, party_id: str, step: str, round: int, payload: wire.Payload) -> int:
        """Queue a coordinator payload (sender "") for a party; returns the bytes queued."""
        mid = next(self._message_ids)
        size = 0
        for frame in wire.encode(payload, job_id=self.config.job_id, step=self.wire_name(step), round=round, sender="",
                                 recipient=party_id, message_id=mid):
            size += len(frame.data)
            self.parties[party_id].mailbox.put(pb.PullItem(frame=frame))
        self.run_ledger.sent(step, size)
        return size

    def finish(self, reason: str = "") -> None:
        self._settle(Stage.DONE, reason)
        for pid in self.active:
            self._end(pid, pb.JobEnd.DONE, reason or "job complete")
        log.info("job %s: done in %.3fs with %d parties", self.config.job_id, self.clock() - self.started_at,
                 len(self.active))
        self._ended()

    def cancel(self, reason: str) -> None:
        """End the run now (the operator's `job cancel`, or the coordinator shutting down): every
        joined party hears CANCELLED with `reason` and stops; nothing more is accepted."""
        with self.lock:
            if self.stage.ended:
                raise InvalidInput(f"run {self.run_id or self.config.job_id} is already {self.stage.value}")
            self._settle(Stage.CANCELLED, reason)
            for pid in self.parties:
                self._end(pid, pb.JobEnd.CANCELLED, reason)
            log.warning("job %s: run %s cancelled: %s", self.config.job_id, self.run_id, reason)
            self._ended()

    def _settle(self, stage: Stage, reason: str) -> None:
        """The run is over: no step runs, and a late payload of the last one is ignored."""
        self.stage = stage
        self.outcome_reason = reason
        if self.step is not None:
            self.past_steps.add(self.step.name)
        self.step = None

    def _ended(self) -> None:
        self.done_event.set()
        if self.events is not None:
            self.events.ended(self)

    # --- internals ------------------------------------------------------------------------

    def _join_status(self, now: float) -> None:
        """Tell every joined party who is in and how long the job still waits (DESIGN §9: no guessing)."""
        self._status_at = now
        waiting = [p for p in self.config.expected_parties if p not in self.parties]
        status = pb.JoinStatus(joined=len(self.parties), expected=len(self.config.expected_parties),
                               min_parties=self.config.min_parties, waiting_for=waiting,
                               join_deadline_seconds=max(0.0, self.join_deadline - self._status_at))
        for party in self.parties.values():
            party.mailbox.put(pb.PullItem(status=status))

    def _start(self) -> None:
        try:
            self.check_start()
        except InvalidInput as exc:
            self._fail(str(exc), outcome=pb.JobEnd.REFUSED)
            return
        self.active = sorted(self.parties)
        # the id every party derives from the same roster (crypto/identity.py): bound into reveals
        self.session_id = session_id(self.parties[p].signed.bundle for p in self.active)
        for pid in [p for p in self.config.expected_parties if p not in self.parties]:
            self.dropped.add(pid)  # never joined (DESIGN §5: "before SecureHamming = never joined")
        roster = pb.Roster(bundles=[pb.SignedBundle(bundle=self.parties[p].signed.bundle,
                                                    signature=self.parties[p].signed.signature)
                                    for p in self.active])
        for pid in self.active:
            self.parties[pid].mailbox.put(pb.PullItem(roster=roster))
        self.stage = Stage.SETUP
        if self.events is not None:
            self.events.started(self)
        self.start_step(SEED_STEP)

    def _complete(self, step: Step) -> None:
        seconds = self.clock() - step.started
        self.run_ledger.record(step.name, seconds, bytes_in=step.bytes_in, bytes_relayed=step.bytes_relayed)
        if self.events is not None:
            self.events.step_done(self, step.name, seconds, step.bytes_in, step.bytes_relayed)
        log.info("job %s: step %s round %d complete in %.3fs; %d parties, %d bytes in, %d bytes relayed",
                 self.config.job_id, step.name, step.round, self.clock() - step.started, len(step.participants),
                 step.bytes_in, step.bytes_relayed)
        if step.name == SEED_STEP:
            self.stage = Stage.RUNNING
            if self.config.params.prepares:
                self.start_step(MOMENTS_STEP)
            else:
                self.begin()
        elif step.name == MOMENTS_STEP:
            self._moments = step  # DESIGN §6.1: all arrays are here; ask each party for its self mask
            self.start_step(moments.REVEAL_STEP, list(step.participants), round=step.round)
        elif step.name == moments.REVEAL_STEP:
            self._prepared(step)
        else:
            self.on_step_complete(step)

    def _prepared(self, reveal: Step) -> None:
        """The pooled moments are in: every participant gets them, then the job type's first step."""
        assert self._moments is not None
        total = open_sum(self._moments, reveal, *moments.wire(self.table_dim))
        params = self.config.params
        self.scaling = Scaling.from_sums(moments.decode(total), moments.FRAC_BITS, standardise=params.standardise,
                                         impute=params.impute == "mean")
        dropped = self.table_dim - self.scaling.dim
        log.info("job %s: pooled moments of %d parties; %d of %d features kept", self.config.job_id,
                 len(reveal.participants), self.scaling.dim, self.table_dim)
        for pid in reveal.participants:
            self.send(pid, MOMENTS_RESULT_MSG, reveal.round, total)
        try:
            if self.scaling.dim == 0:
                raise InvalidInput(f"all {self.table_dim} feature columns are constant or empty on every party")
            self.check_prepared()
        except InvalidInput as exc:
            self._fail(f"{exc}" + (f" ({dropped} constant columns dropped)" if dropped else ""),
                       outcome=pb.JobEnd.REFUSED)
            return
        self.begin()

    def _relay(self, step: Step, sender: str, msg: wire.Message) -> None:
        if step.name not in self.relay_steps:
            raise InvalidInput(f"step {step.name!r} carries no peer-to-peer messages")
        if msg.recipient not in step.participants or msg.recipient == sender:
            raise InvalidInput(f"recipient {msg.recipient!r} is not another participant of step {step.name!r}")
        if step.name == SEED_STEP and sender != step.participants[0]:
            raise ProtocolError(f"only the leader {step.participants[0]!r} distributes the common seed")
        if (sender, msg.recipient) in step.relays:
            raise ResourceExhausted(f"{sender!r} already sent its {step.name!r} message to {msg.recipient!r} "
                                    f"in round {step.round}")
        mailbox = self.parties[msg.recipient].mailbox
        if mailbox.queued_bytes + msg.nbytes > MAILBOX_MAX_BYTES:
            raise ResourceExhausted(f"{msg.recipient!r} has {mailbox.queued_bytes} bytes waiting; "
                                    "the coordinator will not queue more for it")
        step.relays.add((sender, msg.recipient))
        mid = next(self._message_ids)
        for frame in wire.encode(msg.payload, job_id=self.config.job_id, step=self.wire_name(msg.step), round=msg.round,
                                 sender=sender, recipient=msg.recipient, message_id=mid):
            self.parties[msg.recipient].mailbox.put(pb.PullItem(frame=frame))
        step.bytes_relayed += msg.nbytes

    def _drop(self, parties: set[str], reason: str) -> None:
        parties = {p for p in parties if p in self.active}
        if not parties:
            return
        for pid in sorted(parties):
            self.active.remove(pid)
            self.dropped.add(pid)
            self.drop_reasons[pid] = reason
            self._end(pid, pb.JobEnd.DROPPED, reason)
            if self.events is not None:
                self.events.dropped(self, pid, reason)
            log.warning("job %s: dropped %s (%s)", self.config.job_id, pid, reason)
        if len(self.active) < self.config.min_parties:
            self._fail(f"{len(self.active)} parties left, fewer than min_parties = {self.config.min_parties}")
            return
        step = self.step
        if step is None or not parties & set(step.participants):
            return
        if step.name == SEED_STEP:
            if step.participants[0] in parties:
                self.start_step(SEED_STEP)  # the leader is gone: a new leader draws a new seed
            else:
                step.pending -= parties  # everyone left already holds the seed
                if not step.pending:
                    self._complete(step)
        elif step.name == MOMENTS_STEP:
            self.start_step(MOMENTS_STEP)  # the dropped party's masks no longer cancel: a new round without it
        elif step.name.endswith(REVEAL_SUFFIX):
            self.on_reveal_lost(step, parties & set(step.participants))
        else:
            self.on_dropped(step, parties)

    def _fail(self, reason: str, outcome: int = pb.JobEnd.FAILED) -> None:
        self._settle(Stage.FAILED, reason)
        for pid in self.parties:  # joined parties too, if it fails before the roster went out
            self._end(pid, outcome, reason)
        log.error("job %s: failed: %s", self.config.job_id, reason)
        self._ended()

    def _end(self, party_id: str, outcome: int, reason: str) -> None:
        party = self.parties[party_id]
        if not party.ended:
            party.ended = True
            party.mailbox.put(pb.PullItem(end=pb.JobEnd(outcome=outcome, reason=reason)))
