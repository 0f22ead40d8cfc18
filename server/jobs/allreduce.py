"""Masked all-reduce jobs, FlyNN and RACE (DESIGN §6), on the coordinator.

After SETUP the job runs one step, "sum": every participant pushes its masked array
(uint32 for exact counts, uint64 for DP variants; shape fixed by the job parameters), the
coordinator adds them in the ring, where the pairwise masks cancel, and sends the aggregate to
every participant as message "result". Double masking (DESIGN §6.1): every array also carries
its sender's self mask PRG(b); once all of a round are in, the step "sum_reveal" asks each
participant for b, and only then can the coordinator subtract the self masks. If a participant
drops during "sum", its partners' masks no longer cancel, so the step restarts among the rest in
the next round, under fresh keys (DESIGN §4.2); a drop during "sum_reveal" fails the job, since
the others revealed and mask no other round. The coordinator sees uniformly masked arrays and the
aggregate, nothing else.
"""

from __future__ import annotations

import logging

import numpy as np

from xclp.server.jobs.base import Job
from xclp.server.jobs.state import Step, check_reveal, open_sum, ring_array
from xclp.errors import InvalidInput
from xclp.v1 import wire
from xclp.v1 import xclp_pb2 as pb
from xclp.v1.jobs import FlynnJobParams
from xclp.v1.double_masking import reveal_step
from xclp.v1.steps import RESULT_MSG, SUM_STEP

REVEAL_STEP = reveal_step(SUM_STEP)

log = logging.getLogger("xclp.server")



class AllReduceJob(Job):
    """FlyNN and RACE share this state machine; only the array's dtype and shape differ."""

    def payload_limit(self, sender: str, step: str, recipient: str) -> int:
        if step == SUM_STEP:
            dtype, shape = self.expected()
            return int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        return super().payload_limit(sender, step, recipient)

    def check_summary(self, summary: pb.DataSummary) -> None:
        super().check_summary(summary)
        params = self.config.params
        if isinstance(params, FlynnJobParams):
            try:
                params.method_params(int(summary.dim))  # s <= d: known as soon as the first party joins
            except InvalidInput as exc:
                raise InvalidInput(f"job {self.config.job_id!r} cannot use data of {summary.dim} columns: {exc}") from None

    masked: Step | None = None  # the complete sum round whose self masks are being revealed

    def check_prepared(self) -> None:
        params = self.config.params
        if isinstance(params, FlynnJobParams):
            try:
                params.method_params(self.dim)  # s <= d once constant columns are dropped
            except InvalidInput as exc:
                raise InvalidInput(f"job {self.config.job_id!r} cannot use the {self.dim} features left after "
                                   f"dropping constant columns: {exc}") from None

    def begin(self) -> None:
        self.start_step(SUM_STEP)

    def expected(self) -> tuple[np.dtype, tuple[int, ...]]:
        return self.config.params.wire(self.dim)

    def accept(self, step: Step, sender: str, payload: wire.Payload) -> None:
        if step.name == REVEAL_STEP:
            check_reveal(payload, self.session_id, SUM_STEP, step, sender)
            return
        dtype, shape = self.expected()
        ring_array(payload, dtype, shape, f"the masked array from {sender!r}")

    def on_step_complete(self, step: Step) -> None:
        if step.name == SUM_STEP:
            # DESIGN §6.1: every participant's array is here; ask each for its self-mask seed
            self.masked = step
            self.start_step(REVEAL_STEP, list(step.participants), round=step.round)
            return
        assert self.masked is not None
        total = open_sum(self.masked, step, *self.expected())
        sent = sum(self.send(pid, RESULT_MSG, step.round, total) for pid in step.participants)
        log.info("job %s: aggregate of %d parties sent (%d bytes)", self.config.job_id, len(step.participants), sent)
        self.finish(f"aggregate of {len(step.participants)} parties")

    def on_dropped(self, step: Step, dropped: set[str]) -> None:
        # DESIGN §4.2/§6: the masks of the dropped no longer cancel; restart without them.
        self.start_step(SUM_STEP)
