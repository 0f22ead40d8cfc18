"""How many bytes one message may take, checked at its first frame before anything is buffered
(docs/design.md §3): a party's flood, or a message of a step that is not running, is refused there."""

from __future__ import annotations

from typing import TYPE_CHECKING

from xclp.errors import InvalidInput, XclpError
from xclp.server.phases.base import Phase, Step
from xclp.v1.steps import ALIVE_MAX_BYTES, ALIVE_MSG, LEAVE_MSG

if TYPE_CHECKING:
    from xclp.server.run import Run

LATE_MIN_BYTES = 1024  # a late payload of a step that took no message (its senders were all lost) is small


def payload_limit(run: Run, sender: str, step: str, recipient: str, attempt: int | None = None) -> int:
    """The most bytes one message of `step` from `sender` can need: the running step's limit (for a
    message of the attempt before a restart, read and ignored, that attempt's: it had more
    participants, and so larger frames); for a step that is over (a late payload, read and
    ignored), what `late_bound` kept of it; any other step name is refused."""
    if step in (ALIVE_MSG, LEAVE_MSG):
        return ALIVE_MAX_BYTES
    current, phase, ended = run.step, run.phase, run.last_attempt  # read once, without the lock
    if current is not None and phase is not None and step == current.wire:
        if attempt is not None and attempt < current.attempt and ended is not None and \
                ended.wire == step and ended.attempt == attempt:
            return max(phase.payload_limit(sender, ended, recipient),
                       phase.payload_limit(sender, current, recipient))
        return phase.payload_limit(sender, current, recipient)
    late = run.past_steps.get(step)
    if late is not None:
        return late
    now = current.wire if current is not None else run.stage.value
    raise InvalidInput(f"job {run.config.job_id!r} has no step {step[:64]!r} running or over (it is at {now!r})")


def late_bound(step: Step, phase: Phase | None) -> int:
    """What a late message of `step`, now over, may take: the largest it took, or, when a
    participant's message never came (the step was given up for a restart), what its phase allowed
    one (a payload of 1 536 bytes of a given-up masked sum was refused against a bound of 1 024)."""
    bound = max(step.largest, LATE_MIN_BYTES)
    if phase is not None:
        for party in step.pending:
            try:
                bound = max(bound, phase.payload_limit(party, step, ""))
            except XclpError:  # a phase whose step takes no message of its own from that party
                continue
    return bound


def late(run: Run, sender: str, name: str) -> bool:
    """A payload for a step that is over, or for a scope the sender has left or that is closed."""
    scope = run.phase.scope if run.phase is not None else None
    if scope is not None and scope.prefix and name.startswith(scope.prefix) and sender not in scope.members:
        return True
    return name in run.past_steps or any(name.startswith(prefix) for prefix in run.closed_scopes)
