"""A job type on the party's side (docs/architecture.md): what the registry's `party` names.

A `PartyJob` is made once the common seed is agreed and the data prepared, from a
`PartyContext`; it lists the phases that take messages of their own (`phases`: its masked sums),
to which the session routes those messages and their payload limits; the session hands the job
every step and every other coordinator or peer message, and the job holds its result once the
job's last message is in.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from xclp.client.context import PartyContext, RelayedPhase
from xclp.v1 import wire
from xclp.v1 import xclp_pb2 as pb

if TYPE_CHECKING:
    from xclp.client.jobs.training import RoundRecord


class PartyJob:
    def __init__(self, ctx: PartyContext) -> None:
        self.ctx = ctx
        self.result: np.ndarray | None = None  # what the job gave this party, once it is here

    @property
    def approximation(self) -> dict[str, Any] | None:
        """What an approximation in the job left out (xclp with sparse influence, docs/design.md
        §10.7); None for an exact job (the default)."""
        return None

    def phases(self) -> Sequence[RelayedPhase]:
        """The job's phases now under way that take messages of their own (its masked sums)."""
        return ()

    def on_step(self, step: pb.StepStart) -> None:
        raise NotImplementedError

    def on_message(self, message: wire.Message) -> None:
        raise NotImplementedError

    def payload_limit(self, step: str, sender: str) -> int:
        """The most bytes a message of `step` from `sender` ("" = the coordinator) can need, checked
        at its first frame before anything is buffered; ProtocolError for a message the job never
        gets. The default bounds nothing beyond the wire's own limit."""
        return wire.DEFAULT_MAX_PAYLOAD_BYTES

    def superseded(self, step: pb.StepStart) -> None:
        """From the Pull stream's thread, as `step` arrives (before it is handled): a job whose long
        work a later attempt makes useless may end that work now. The default does nothing."""

    def saved(self) -> tuple[dict[str, Any], dict[str, np.ndarray]] | None:
        """What the job needs to go on after the party's process restarts (client/run_state.py;
        its class's `restored` reads it back), or None where it cannot go on from (the default)."""
        return None

    def privacy(self) -> dict[str, Any] | None:
        """With record-level DP: what this party's rows spent (the accountant's ε over the rounds it
        took part in) and the job's budget; with label-DP (xclp) what its labels spent; None without
        DP."""
        return None

    def rounds(self) -> tuple[RoundRecord, ...]:
        """What this party saw of each training round it took part in (training jobs only)."""
        return ()
