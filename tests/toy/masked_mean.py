"""A job type written as a plug-in, the way docs/architecture.md "Adding a job type" says: the mean
of every feature over all parties' rows, through one masked sum. Nothing outside this file and its
registry entry knows it exists.

    coordinator                               party j
    MaskedSum "mean_sum"            <--       Σ_rows x (fixed point) ‖ n_j, masked (docs/design.md §6.1)
    "mean" (the opened sum)         -->       mean = Σ x / Σ n
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from xclp.client.context import PartyContext
from xclp.client.jobs.base import PartyJob
from xclp.client.ledger import Release, function_id
from xclp.client.phases.masked_sum import MaskedSumParty
from xclp.crypto.fixedpoint import FixedPoint
from xclp.errors import ProtocolError
from xclp.server.jobs.base import CoordinatorJob
from xclp.server.phases.masked_sum import MaskedSum, SumResult
from xclp.v1 import wire
from xclp.v1 import xclp_pb2 as pb
from xclp.v1.params import JobParams, check_names, data_params, int_param, param
from xclp.v1.registry import JobType, Output

SUM_STEP, MEAN_MSG = "mean_sum", "mean"


@dataclass(frozen=True)
class MaskedMeanParams(JobParams):
    frac_bits: int = param("fractional bits of the fixed-point ring", "8 .. 40", default=24)

    @classmethod
    def parse(cls, raw: Mapping[str, Any]) -> MaskedMeanParams:
        check_names(raw, frozenset({"frac_bits"}), "masked_mean")
        return cls(frac_bits=int_param(raw, "frac_bits", 24, low=8), **data_params(raw))

    def wire(self, dim: int) -> tuple[np.dtype[Any], tuple[int, ...]]:
        return np.dtype("<u8"), (dim + 1,)


class MaskedMeanJob(CoordinatorJob[MaskedMeanParams]):
    def program(self, run):
        total: SumResult = yield MaskedSum(run.scope, SUM_STEP, wire=self.params.wire(run.dim))
        run.scope.broadcast(MEAN_MSG, total.attempt, total.value, to=total.participants)
        return f"the mean of {len(total.participants)} parties"


class MaskedMeanParty(PartyJob):
    def __init__(self, ctx: PartyContext) -> None:
        super().__init__(ctx)
        self.params = ctx.params_as(MaskedMeanParams)
        self.codec = FixedPoint(self.params.frac_bits, 64)
        # what the sum releases of the party's data, for its privacy ledger: its column sums and count
        released = Release(function_id("masked-mean", "column sums and count"), "its column sums and row count")
        self.sum = MaskedSumParty(ctx, SUM_STEP, self._local, releases=lambda members: [released])

    def phases(self) -> tuple[MaskedSumParty, ...]:
        """Its masked sum, which takes the coordinator's relays and peers' seed shares of its own."""
        return (self.sum,)

    def _local(self, members: tuple[str, ...]) -> np.ndarray:
        X = self.ctx.data.X
        return np.concatenate([self.codec.encode(X.sum(axis=0), n_terms=len(members)), [np.uint64(X.shape[0])]])

    def on_step(self, step: pb.StepStart) -> None:
        self.sum.on_step(step)

    def on_message(self, message: wire.Message) -> None:
        dtype, shape = self.params.wire(self.ctx.data.X.shape[1])
        total = message.payload
        if (message.step != MEAN_MSG or not isinstance(total, np.ndarray)
                or (total.dtype, total.shape) != (dtype, shape)):
            raise ProtocolError(f"the coordinator sent {message.step!r}, not the {MEAN_MSG!r} of {shape}")
        self.result = self.codec.decode(np.ascontiguousarray(total[:-1])) / int(total[-1])


ENTRY = JobType("masked_mean", MaskedMeanParams, "the mean of every feature over all parties' rows (a toy)",
                coordinator=f"{__name__}:MaskedMeanJob", party=f"{__name__}:MaskedMeanParty", output=Output.MODEL)
