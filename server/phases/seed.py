"""The common seed (docs/design.md §4.3), the first phase of every job.

Step "seed": the leader (the smallest id) seals a fresh 32-byte seed to each other participant
(relayed unread: only the leader may relay, 60 bytes each) and every participant acknowledges
with an empty payload. If the leader is lost, the step restarts without it in its next attempt
and the next-smallest id leads with a new seed; a lost follower is simply not waited for (the
others already hold the seed). The coordinator never learns the seed.
"""

from __future__ import annotations

from xclp.errors import InvalidInput, ProtocolError
from xclp.server.phases.base import Phase, Step
from xclp.v1 import wire
from xclp.v1.steps import SEED_RELAY_MAX_BYTES, SEED_STEP


class SeedPhase(Phase):
    relays = True

    def start(self) -> None:
        self.scope.start_step(SEED_STEP)

    def payload_limit(self, sender: str, step: Step, recipient: str) -> int:
        return SEED_RELAY_MAX_BYTES

    def check_relay(self, step: Step, sender: str, recipient: str, payload: wire.Payload) -> None:
        if sender != step.participants[0]:
            raise ProtocolError(f"only the leader {step.participants[0]!r} distributes the common seed")

    def accept(self, step: Step, sender: str, payload: wire.Payload) -> None:
        if payload != b"":
            raise InvalidInput("the seed step's acknowledgement must be an empty payload")

    def on_step_complete(self, step: Step) -> None:
        self.done()

    def blame(self, step: Step) -> set[str]:
        """A silent leader alone is to blame: the others wait for its seed."""
        if step.participants[0] in step.pending:
            return {step.participants[0]}
        return set(step.pending)

    def on_dropped(self, step: Step, dropped: set[str]) -> None:
        if step.participants[0] in dropped:
            rest = [p for p in step.participants if p not in dropped]
            self.scope.start_step(SEED_STEP, rest, step.attempt + 1)  # a new leader draws a new seed
            return
        step.pending -= dropped  # everyone left already holds the seed
        if not step.pending:
            self.run.end_step(step)
            self.done()
