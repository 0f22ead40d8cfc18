"""Liveness, not a stopwatch (docs/operating.md "Long runs"): when a party is late.

A step's deadline used to be a stopwatch: `step_seconds` after a step started, every participant
that still owed a contribution was dropped, however busy it was (at 3 × 4 000 rows all three
parties were dropped at 600 s with SecureHamming 34 % done and their pieces still arriving). Now a
party is late only when it owes the step's next message (`Phase.blame`) and nothing has come from
it — no frame of any message, no progress report — for `step_seconds`. A party at long local work
says so: an `alive` message (xclp.v1.steps.ALIVE_MSG) at least every `step_seconds / 4` while it
is busy, carrying a line of what it is doing, which `xclp-server job show` prints with the time it
was heard. An optional `max_run_seconds` bounds a whole run.
"""

from __future__ import annotations

from collections.abc import Mapping

from xclp.errors import InvalidInput
from xclp.server.mailbox import Party
from xclp.server.phases.base import Phase, Step
from xclp.v1 import wire
from xclp.v1.steps import ALIVE_MAX_BYTES


def report(party: Party, payload: wire.Payload, now: float) -> None:
    """A party's progress report: what it is doing, as a line (UTF-8, at most ALIVE_MAX_BYTES)."""
    if not isinstance(payload, bytes) or len(payload) > ALIVE_MAX_BYTES:
        raise InvalidInput(f"a progress report is at most {ALIVE_MAX_BYTES} bytes of text")
    try:
        text = payload.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidInput("a progress report must be UTF-8 text") from None
    party.heard_at = now
    party.activity = "".join(c if c.isprintable() else " " for c in text).strip()


def late(step: Step, phase: Phase, parties: Mapping[str, Party], now: float, step_seconds: float) -> set[str]:
    """Who of those that owe `step`'s next message has been silent for `step_seconds`."""
    if now - step.started < step_seconds:
        return set()
    return {p for p in phase.blame(step) if now - max(step.started, parties[p].heard_at) >= step_seconds}
