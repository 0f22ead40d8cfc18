"""Liveness, not a stopwatch (docs/operating.md "Long runs"): when a party is late.

A step's deadline used to be a stopwatch: `step_seconds` after a step started, every participant
that still owed a contribution was dropped, however busy it was (at 3 × 4 000 rows all three
parties were dropped at 600 s with SecureHamming 34 % done and their pieces still arriving). Now a
party is late only when it owes the step's next message (`Phase.blame`) and nothing has come from
it — no frame of any message, no progress report — for `step_seconds`. A party at long local work
says so: an `alive` message (xclp.v1.steps.ALIVE_MSG) at least every `step_seconds / 4` while it
is busy, carrying a line of what it is doing, which `xclp-server job show` prints with the time it
was heard. An optional `max_run_seconds` bounds a whole run.

A lost connection is not a dropout at once: a party that can resume (capability RESUMES) keeps its
place for `reconnect_seconds` (`may_reconnect`, `gone`) and comes back on a new Pull stream, which
sends first what the lost one may not have delivered (server/mailbox.py). A party that stops on its
own says so (a `leave` message, `reason`) and is dropped at once.

The other way round, each party hears from a running run at least every NEWS_SECONDS (a RunAlive
item, `news`): the coordinator's own work (the influence solve) and another party's SecureHamming
can keep a party waiting longer than its idle timeout with nothing else to hear.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING

from xclp.errors import InvalidInput, NotAuthorized
from xclp.server.mailbox import Party
from xclp.server.phases.base import MAX_RESTARTS, Phase, Step
from xclp.v1 import wire
from xclp.v1 import xclp_pb2 as pb
from xclp.v1.steps import ALIVE_MAX_BYTES, RESUMES, RUN_ALIVE

if TYPE_CHECKING:
    from xclp.server.run import Run

log = logging.getLogger("xclp.server")
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


def reason(payload: wire.Payload) -> str:
    """Why a party leaves (its `leave` message), as a printable line."""
    if not isinstance(payload, bytes) or len(payload) > ALIVE_MAX_BYTES:
        raise InvalidInput(f"a leave message is at most {ALIVE_MAX_BYTES} bytes of text")
    text = "".join(c if c.isprintable() else " " for c in payload.decode("utf-8", errors="replace")).strip()
    return f"left the run ({text})" if text else "left the run"


def may_reconnect(party: Party, reconnect_seconds: float) -> bool:
    """Whether a party whose Pull stream ended keeps its place for a while (module docstring)."""
    return reconnect_seconds > 0 and RESUMES in party.capabilities


def attach(run: Run, party_id: str, *, resume: bool = False, received: int = 0,
           restarted: bool = False) -> tuple[Party, int]:
    """A Pull stream of the party's opens, or, after its connection was lost, resumes, or, after its
    process restarted, starts again (`Run.restarted`); returns its place and the stream's number
    (server/mailbox.py)."""
    with run.lock:
        party = run.parties.get(party_id)
        if party is None or (party.end_delivered and not resume) or (restarted and party.ended):
            raise NotAuthorized(f"party {party_id!r} has no open place in job {run.config.job_id!r}")
        if restarted:
            if party_id not in run.active:
                raise InvalidInput(f"party {party_id!r} has no running place in job {run.config.job_id!r} to rejoin")
            stream = party.mailbox.restart()
            party.lost_at, party.heard_at, party.restarts = None, run.clock(), party.restarts + 1
            log.warning("job %s: %s restarted its process and rejoins (restart %d)", run.config.job_id, party_id,
                        party.restarts)
            # each restart costs every member the pieces in flight: a party that keeps restarting
            # (crashing, or on purpose) is dropped rather than let hold the run back for good
            run.restarted(party_id, f"its process restarted {party.restarts} times in the run (at most "
                                    f"{MAX_RESTARTS})" if party.restarts > MAX_RESTARTS else "")
            return party, stream
        if resume and not (party.mailbox.streaming and RESUMES in party.capabilities):
            raise InvalidInput(f"party {party_id!r} has no Pull stream of job {run.config.job_id!r} to resume")
        if party.mailbox.streaming and not resume:
            raise InvalidInput(f"party {party_id!r} already has a Pull stream open")
        stream, again = party.mailbox.attach(resume=resume, received=received)
        if party.lost_at is not None:
            log.warning("job %s: %s reconnected after %.1f s; %d items go again", run.config.job_id, party_id,
                        run.clock() - party.lost_at, again)
            party.lost_at = None
        return party, stream


def gone(parties: Mapping[str, Party], members: list[str], now: float, reconnect_seconds: float) -> set[str]:
    """Of `members` (the run's active parties, or in the lobby those joined), those whose connection
    was lost `reconnect_seconds` ago and who did not come back."""
    return {p for p in members if (lost := parties[p].lost_at) is not None and now - lost >= reconnect_seconds}


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
