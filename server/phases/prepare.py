"""Data preparation before a job's first step (docs/design.md §8): the pooled moments, as one masked sum.

Every participant pushes its (n, Σx, Σx²) per feature in wide fixed point (xclp.v1.moments) in
the masked sum "moments"; the coordinator opens the sum, sends it back to every participant as
message "moments_result", and every side derives the same `Scaling` (impute, standardise, drop
the columns constant everywhere). The coordinator learns the pooled moments, nothing per party.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from xclp.data.prep import Scaling
from xclp.errors import InvalidInput
from xclp.server.phases.base import PhaseFailed, Program, Scope
from xclp.server.phases.masked_sum import MaskedSum, SumResult
from xclp.v1 import moments
from xclp.v1 import xclp_pb2 as pb
from xclp.v1.params import JobParams
from xclp.v1.steps import MOMENTS_RESULT_MSG, MOMENTS_STEP

log = logging.getLogger("xclp.server")


def prepare(scope: Scope, params: JobParams, table_dim: int, check: Callable[[int], None]) -> Program[Scaling]:
    """The pooled Scaling. The job is refused (JobEnd.REFUSED) if its parameters (`params.check_dim`)
    or its type (`check(dim)` raises InvalidInput) cannot use the prepared data."""
    total: SumResult = yield MaskedSum(scope, MOMENTS_STEP, wire=moments.wire(table_dim), what="moments")
    scaling = moments.pooled_scaling(params, moments.decode(total.value), table_dim)
    log.info("job %s: pooled moments of %d parties; %d of %d features kept", scope.run.config.job_id,
             len(total.participants), scaling.dim, table_dim)
    scope.broadcast(MOMENTS_RESULT_MSG, total.attempt, total.value, to=total.participants)
    if scaling.dim == 0:
        raise PhaseFailed(f"all {table_dim} feature columns are constant or empty on every party", pb.JobEnd.REFUSED)
    dropped = table_dim - scaling.dim
    try:
        params.check_dim(scaling.dim)
        check(scaling.dim)
    except InvalidInput as exc:
        what = f"{scaling.dim} features" + (f" left after dropping {dropped} constant columns" if dropped else "")
        raise PhaseFailed(f"job {scope.run.config.job_id!r} cannot use {what}: {exc}", pb.JobEnd.REFUSED) from None
    return scaling
