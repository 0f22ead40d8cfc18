"""What a phase is on the coordinator, and what it runs in (docs/architecture.md "Phases").

A job is a program of phases (`Program`): a generator that yields one `Phase` at a time and
receives what the phase produced, e.g.

    total = yield MaskedSum(scope, "sum", wire=...)
    scope.broadcast(RESULT_MSG, total.attempt, total.value, to=total.participants)

A phase starts one or more steps among the parties of its `Scope`, validates what they push
(`accept`), decides what happens when every participant of a step has pushed (`on_step_complete`)
or some of them left (`on_dropped`), and ends with `done(result)` or `fail(reason)`. A failure is
raised in the program at the `yield` (PhaseFailed), so a training round can catch it and skip the
round while the same failure ends a job that does not catch it. The run (server/run.py) owns
everything else: the lock, the parties and their mailboxes, deadlines, drops and the ledger.

A `Work` phase is the coordinator's own long work between steps (the influence solve and its
delivery): it runs on a thread of its own, never in an RPC handler and never under the run's lock,
which it takes only to hand its result over, so a lost party, a cancel or a shutdown is seen while
it computes (docs/operating.md "Long runs").

A scope is where a phase runs: the prefix of its step names on the wire ("" for the job, "r3."
for training round 3), the session id its masks and reveal digests are bound to, the parties still
in it, and what a missed deadline costs (leaving the job, or only the round).
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable, Generator, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from xclp.errors import InvalidInput, ResourceExhausted, XclpError
from xclp.v1 import xclp_pb2 as pb
from xclp.v1.double_masking import REVEAL_BYTES, REVEAL_SUFFIX
from xclp.v1.wire import DEFAULT_MAX_PAYLOAD_BYTES, Payload

if TYPE_CHECKING:
    from xclp.server.run import Run

log = logging.getLogger("xclp.server")


class PhaseFailed(XclpError):
    """A phase cannot produce its result; `outcome` is what the parties hear if the job ends of it
    (JobEnd.FAILED, or REFUSED when the job cannot run with the parties' data)."""

    def __init__(self, reason: str, outcome: pb.JobEnd.Outcome = pb.JobEnd.FAILED) -> None:
        super().__init__(reason)
        self.reason = reason
        self.outcome = outcome


@dataclass(frozen=True)
class Activity:
    """What a run is doing now, for `xclp-server job show` (docs/design.md §10): replaced whole, so
    the operator's view reads it without the run's lock, which a long coordinator computation
    (the influence solve) holds. `describe` says how far it has got (a Meter's), "" if nobody says."""

    step: str = ""  # a step's wire name, or the coordinator's own work ("influence")
    round: int = 0
    describe: Callable[[], str] = str

    def progress(self) -> str:
        return self.describe()


@dataclass
class Step:
    """One attempt at one step: who takes part, who still owes a contribution, since when (a party
    that owes one is late once silent for `step_seconds`, server/liveness.py).

    `name` is the phase's name for it ("update"), `wire` the name parties see ("r3.update");
    an attempt is a retry of the step after a dropout (the wire calls it "round")."""

    name: str
    wire: str
    attempt: int
    participants: tuple[str, ...]
    started: float
    pending: set[str]
    received: dict[str, Payload] = field(default_factory=dict)
    bytes_in: int = 0
    bytes_relayed: int = 0
    largest: int = 0  # the largest message of this step so far (bounds a late one, docs/design.md §3)
    relays: Counter[tuple[str, str]] = field(default_factory=Counter)  # (sender, recipient): relays this attempt
    ended: bool = False  # complete, or abandoned for another step

    def check_relay(self, sender: str, recipient: str, limit: int = 1) -> None:
        """At most `limit` relays per sender and recipient per attempt (the phase's), to another participant."""
        if recipient not in self.participants or recipient == sender:
            raise InvalidInput(f"recipient {recipient!r} is not another participant of step {self.wire!r}")
        if self.relays[(sender, recipient)] >= limit:
            raise ResourceExhausted(f"{sender!r} already sent its {self.wire!r} "
                                    f"{'message' if limit == 1 else f'{limit} messages'} to {recipient!r} "
                                    f"in round {self.attempt}")


MAX_RESTARTS = 3  # times one party's process may restart and rejoin one run (server/liveness.py)


def attempt_after_restart(saved: int, parties: int) -> int:
    """The attempt a restarted coordinator starts a step at, from the one its checkpoint saved
    (server/resume.py): past any the parties can have seen since, so that no attempt's seeds or
    relays mix with another's. Since the checkpoint, each later attempt either lost one of the
    step's `parties` (at most all of them) or took a restarted party back (at most MAX_RESTARTS
    times each); the attempts in between are never used, which costs nothing."""
    return saved + parties * (1 + MAX_RESTARTS)


class Scope:
    """Where phases run: a step-name prefix, a session id, its members, what a late party loses."""

    def __init__(self, run: Run, prefix: str, session_id: bytes, members: Iterable[str], *, min_members: int,
                 leave_on_deadline: bool = False) -> None:
        self.run = run
        self.prefix = prefix
        self.session_id = session_id
        self.members: list[str] = sorted(members)
        self.min_members = min_members
        # False: a party that misses a deadline is dropped from the job; True: it only leaves this scope
        self.leave_on_deadline = leave_on_deadline

    def wire(self, name: str) -> str:
        return self.prefix + name

    def start_step(self, name: str, participants: Sequence[str] | None = None, attempt: int = 0) -> Step:
        return self.run.start_step(self, name, self.members if participants is None else participants, attempt)

    def send(self, party_id: str, name: str, attempt: int, payload: Payload) -> int:
        """Queue a coordinator message (sender "") for a party; returns the bytes queued."""
        return self.run.send(party_id, self.wire(name), attempt, payload, ledger_name=name)

    def wait_for_delivery(self, party_id: str, backlog: int) -> bool:
        """Let `party_id` take what waits for it down to `backlog` bytes before queuing more (at most a
        step's deadline: a party that stops reading is dealt with as any silent party)."""
        return self.run.parties[party_id].mailbox.wait_below(backlog, self.run.config.step_seconds)

    def capable(self, parties: Iterable[str], capability: str) -> bool:
        """Whether every party of `parties` said at Join its version understands `capability`."""
        return all(capability in self.run.parties[p].capabilities for p in parties)

    def report(self, describe: Callable[[], str], *, work: str = "") -> None:
        """How far the current step (or the coordinator's own `work`, between steps) has got."""
        self.run.report(describe, work=self.wire(work) if work else "")

    def broadcast(self, name: str, attempt: int, payload: Payload, to: Iterable[str] | None = None) -> int:
        """The same message to every member (or to those of `to` still members); returns the bytes queued."""
        targets = self.members if to is None else [p for p in to if p in self.members]
        return sum(self.send(p, name, attempt, payload) for p in targets)


class Phase:
    """Base of the coordinator's phases; see the module docstring for the protocol."""

    relays = False  # whether parties may address this phase's steps to each other (relayed unread)

    def __init__(self, scope: Scope) -> None:
        self.scope = scope

    @property
    def run(self) -> Run:
        return self.scope.run

    # --- the protocol -------------------------------------------------------------------------

    def start(self) -> None:
        """Start the phase's first step (or finish at once with `done`)."""
        raise NotImplementedError

    def payload_limit(self, sender: str, step: Step, recipient: str) -> int:
        """The most bytes one message of `step` from `sender` can need (checked before buffering)."""
        if step.name.endswith(REVEAL_SUFFIX):
            return REVEAL_BYTES
        return DEFAULT_MAX_PAYLOAD_BYTES

    def check_relay(self, step: Step, sender: str, recipient: str, payload: Payload) -> None:
        """Refuse (InvalidInput) a peer-to-peer message this phase does not carry."""
        if not self.relays:
            raise InvalidInput(f"step {step.wire!r} carries no peer-to-peer messages")

    def relay_limit(self, step: Step, sender: str, recipient: str) -> int:
        """How many messages `sender` may relay to `recipient` in one attempt of `step` (checked before each)."""
        return 1

    def accept(self, step: Step, sender: str, payload: Payload) -> None:
        """Validate a contribution to `step` (raise InvalidInput); the run then records it."""
        raise InvalidInput(f"step {step.wire!r} takes no contributions")

    def owes(self, step: Step, sender: str) -> bool:
        """After `accept`: whether `sender` still owes more contributions to `step` (a phase that takes
        its contributions in pieces says so; the run then neither keeps the piece nor marks it done)."""
        return False

    def on_step_complete(self, step: Step) -> None:
        raise NotImplementedError

    def on_dropped(self, step: Step, dropped: set[str]) -> None:
        """Participants of `step` left the scope (dropped from the job, or late in a round); the
        scope still has at least its minimum of members."""
        raise NotImplementedError

    def on_restarted(self, step: Step, party: str) -> bool:
        """A participant of `step` restarted its process and holds nothing of the step: whether the
        phase starts the step again with it (else the run drops it)."""
        return False

    def on_left(self, gone: set[str]) -> None:
        """Members left the scope while no step of this phase ran (its Work between steps); the
        scope still has at least its minimum of members."""

    def complete_if_done(self, step: Step) -> None:
        """After a drop left the others' contributions standing: end `step` if nobody owes one."""
        if not step.pending:
            self.run.end_step(step)
            self.on_step_complete(step)

    def blame(self, step: Step) -> set[str]:
        """Who leaves when `step` misses its deadline: those who still owe a contribution."""
        return set(step.pending)

    # --- ending -------------------------------------------------------------------------------

    def done(self, result: Any = None) -> None:
        self.run.resume(self, result)

    def fail(self, reason: str, outcome: pb.JobEnd.Outcome = pb.JobEnd.FAILED) -> None:
        self.run.resume(self, error=PhaseFailed(reason, outcome))


class Work(Phase):
    """The coordinator's own long work (module docstring): `work()` runs on a thread of its own
    without the run's lock; it checks `live()` between its pieces and takes the lock (`locked`)
    only for the moment it queues something or changes the run. Its result, or PhaseFailed, goes
    to the program under the lock."""

    def start(self) -> None:
        threading.Thread(target=self._work, name=f"xclp-work-{self.run.config.job_id}", daemon=True).start()

    def work(self) -> Any:
        raise NotImplementedError

    def live(self) -> bool:
        """Whether the run still waits for this phase (not cancelled, failed or moved on)."""
        return self.run.phase is self and not self.run.stage.ended

    @property
    def locked(self) -> threading.RLock:
        return self.run.lock

    def _work(self) -> None:
        error: PhaseFailed | None = None
        result: Any = None
        try:
            result = self.work()
        except PhaseFailed as exc:
            error = exc
        except XclpError as exc:  # out-of-range values and the like: no restart fixes them
            error = PhaseFailed(str(exc))
        except Exception:  # a bug: the run fails with a word, the coordinator goes on
            log.exception("job %s: the coordinator's work failed", self.run.config.job_id)
            error = PhaseFailed("the coordinator's own work failed (its log says why)")
        with self.locked:
            if error is not None:
                self.fail(error.reason, error.outcome)
            else:
                self.done(result)

    def on_step_complete(self, step: Step) -> None:  # it starts no step
        raise AssertionError("a Work phase starts no step")

    def on_dropped(self, step: Step, dropped: set[str]) -> None:
        raise AssertionError("a Work phase starts no step")


T = TypeVar("T")
# Phases in order: yields each phase, receives its result, returns its own result (a job's
# program returns the text the parties hear when the run is done).
Program = Generator[Phase, Any, T]
