"""Masked all-reduce jobs, FlyNN and RACE (docs/design.md §6), on the coordinator.

One masked sum "sum" of every party's array (uint32 for exact counts, uint64 for DP variants;
shape from the job parameters, xclp.v1.allreduce), then the aggregate to every participant as
message "result". The coordinator sees uniformly masked arrays and the aggregate, nothing else.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from xclp.server.jobs.base import CoordinatorJob
from xclp.server.phases.base import Program
from xclp.server.phases.masked_sum import MaskedSum, SumResult
from xclp.v1.allreduce import RESULT_MSG, SUM_STEP, FlynnJobParams, RaceJobParams

if TYPE_CHECKING:
    from xclp.server.run import Run

log = logging.getLogger("xclp.server")


class AllReduceJob(CoordinatorJob[FlynnJobParams | RaceJobParams]):
    """FlyNN and RACE share this program; only the array's dtype and shape differ."""

    def program(self, run: Run) -> Program[str]:
        total: SumResult = yield MaskedSum(run.scope, SUM_STEP, wire=self.params.wire(run.dim))
        sent = run.scope.broadcast(RESULT_MSG, total.attempt, total.value, to=total.participants)
        log.info("job %s: aggregate of %d parties sent (%d bytes)", self.config.job_id, len(total.participants), sent)
        return f"aggregate of {len(total.participants)} parties"
