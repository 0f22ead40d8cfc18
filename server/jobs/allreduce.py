"""Masked all-reduce jobs, FlyNN and RACE (DESIGN §6), on the coordinator.

After SETUP the job runs one step, "sum": every participant pushes its masked array
(uint32 for exact counts, uint64 for DP variants; shape fixed by the job parameters), the
coordinator adds them in the ring, where the pairwise masks cancel, and sends the aggregate to
every participant as step "result". If a participant drops, its partners' masks no longer
cancel, so the step restarts among the rest in the next round, under fresh keys (DESIGN §4.2).
The coordinator sees uniformly masked arrays and the aggregate, nothing else.
"""

from __future__ import annotations

import logging

import numpy as np

from xclp.crypto.masking import ring_sum
from xclp.server.jobs.base import Job, Step, ring_array
from xclp.errors import InvalidInput
from xclp.v1 import wire
from xclp.v1 import xclp_pb2 as pb
from xclp.v1.jobs import FlynnJobParams
from xclp.v1.steps import RESULT_MSG, SUM_STEP

log = logging.getLogger("xclp.server")



class AllReduceJob(Job):
    """FlyNN and RACE share this state machine; only the array's dtype and shape differ."""

    def check_summary(self, summary: pb.DataSummary) -> None:
        super().check_summary(summary)
        params = self.config.params
        if isinstance(params, FlynnJobParams):
            try:
                params.method_params(int(summary.dim))  # s <= d: known as soon as the first party joins
            except InvalidInput as exc:
                raise InvalidInput(f"job {self.config.job_id!r} cannot use data of {summary.dim} columns: {exc}") from None

    def begin(self) -> None:
        self.start_step(SUM_STEP)

    def expected(self) -> tuple[np.dtype, tuple[int, ...]]:
        return self.config.params.wire(self.dim)

    def accept(self, step: Step, sender: str, payload: wire.Payload) -> None:
        dtype, shape = self.expected()
        ring_array(payload, dtype, shape, f"the masked array from {sender!r}")

    def on_step_complete(self, step: Step) -> None:
        total = ring_sum(np.asarray(step.received[p]) for p in step.participants)
        sent = sum(self.send(pid, RESULT_MSG, step.round, total) for pid in step.participants)
        log.info("job %s: aggregate of %d parties sent (%d bytes)", self.config.job_id, len(step.participants), sent)
        self.finish(f"aggregate of {len(step.participants)} parties")

    def on_dropped(self, step: Step, dropped: set[str]) -> None:
        # DESIGN §4.2/§6: the masks of the dropped no longer cancel; restart without them.
        self.start_step(SUM_STEP)
