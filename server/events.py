"""What a run is at (its stage) and what the coordinator hears of it (RunEvents): the run
(server/run.py) reports its transitions to the registry (server/coordinator.py), which stores them."""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from xclp.v1 import wire

if TYPE_CHECKING:
    from xclp.server.run import Run

# Called with (job_id, step, attempt, sender, payload) for every contribution; tests only.
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
    """What the coordinator's run registry (server/coordinator.py) hears of a run: called under the
    run's lock, so each must be quick; none carries data, keys or masks."""

    def joined(self, run: Run, party_id: str, rows: int) -> None: ...
    def left(self, run: Run, party_id: str) -> None: ...
    def started(self, run: Run) -> None: ...
    def dropped(self, run: Run, party_id: str, reason: str) -> None: ...
    def declined(self, run: Run, party_id: str, reason: str) -> None: ...
    def step_done(self, run: Run, name: str, seconds: float, bytes_in: int, bytes_relayed: int) -> None: ...
    def phase_over(self, run: Run) -> None: ...  # the program moved on: a checkpoint of the phase is stale
    def ended(self, run: Run) -> None: ...
