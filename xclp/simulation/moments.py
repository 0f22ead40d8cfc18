"""The moments phase (docs/design.md §8) with every party in one process: each party's contribution as it
encodes it (exact wide fixed point, or with moments_epsilon its clipped sums and its Skellam share,
xclp.privacy.dp_moments), summed as the coordinator opens the masked sum, decoded as both ends decode it."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from xclp.data.prep import Scaling, local_moments
from xclp.errors import InvalidInput
from xclp.privacy import dp_moments
from xclp.privacy.dpsgd import RoundNoise
from xclp.v1 import moments
from xclp.v1.params import JobParams


def pooled_scaling(tables: Sequence[np.ndarray], params: JobParams) -> Scaling:
    """The Scaling every party of `tables` (float64[n_j, d], NaN = missing) would apply."""
    if not params.prepares:
        raise InvalidInput("the job neither standardises nor imputes: it has no moments phase")
    if len(tables) < 2 or len({X.shape[1] for X in tables}) != 1:
        raise InvalidInput("the moments phase needs at least two tables with the same feature columns")
    dim, n = tables[0].shape[1], len(tables)
    params.check_table(dim)
    plan = params.moments_plan(dim)
    total = np.zeros(moments.wire(dim)[1], dtype=np.uint64)
    for X in tables:
        if plan is None:
            total += moments.encode(local_moments(X), n)
        else:
            clipped = dp_moments.local_sums(X, params.moments_ranges(dim), plan.scale_bits)
            total += moments.encode_private(clipped, RoundNoise(plan, plan.cells).for_members(n), plan, n)
    return moments.pooled_scaling(params, moments.decode(total), dim)
