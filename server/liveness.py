"""Liveness, not a stopwatch (docs/operating.md "Long runs"): when a party is late.

A step's deadline used to be a stopwatch: `step_seconds` after a step started, every participant
that still owed a contribution was dropped, however busy it was (at 3 × 4 000 rows all three
parties were dropped at 600 s with SecureHamming 34 % done and their pieces still arriving). Now a
party is late only when it owes the step's next message (`Phase.blame`) and nothing has come from
it — no frame of any message, no progress report — for `step_seconds`. A party at long local work
says so: an `alive` message (xclp.v1.steps.ALIVE_MSG) at least every `step_seconds / 4` while it
is busy, carrying a line of what it is doing, which `xclp-server job show` prints with the time it
was heard. An optional `max_run_seconds` bounds a whole run.

The other way round, each party hears from a running run at least every NEWS_SECONDS (a RunAlive
item, `news`): the coordinator's own work (the influence solve) and another party's SecureHamming
can keep a party waiting longer than its idle timeout with nothing else to hear.
"""

from __future__ import annotations

from collections.abc import Mapping

from xclp.errors import InvalidInput
from xclp.server.mailbox import Party
from xclp.server.phases.base import Phase, Step
from xclp.v1 import wire
from xclp.v1 import xclp_pb2 as pb
from xclp.v1.steps import ALIVE_MAX_BYTES, RUN_ALIVE

NEWS_SECONDS = 60.0  # well inside a party's idle timeout (default 900 s)


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


def news(parties: Mapping[str, Party], now: float, started: float, what: str) -> None:
    """A RunAlive to each party not told for NEWS_SECONDS since the run started (module docstring),
    if its version understands it."""
    for party in parties.values():
        if RUN_ALIVE in party.capabilities and now - max(started, party.news_at) >= NEWS_SECONDS:
            party.news_at = now
            party.mailbox.put(pb.PullItem(alive=pb.RunAlive(step=what, seconds=now - started)))


def late(step: Step, phase: Phase, parties: Mapping[str, Party], now: float, step_seconds: float) -> set[str]:
    """Who of those that owe `step`'s next message has been silent for `step_seconds`."""
    if now - step.started < step_seconds:
        return set()
    return {p for p in phase.blame(step) if now - max(step.started, parties[p].heard_at) >= step_seconds}
