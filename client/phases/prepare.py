"""Data preparation on the party's side (docs/design.md §8); its counterpart is server/phases/prepare.py.

The party's local (n, Σx, Σx²) per feature goes into the masked sum "moments" (docs/design.md §6.1);
the pooled moments come back as message "moments_result", and the party applies the resulting
`Scaling` to its own table (impute, standardise, drop constant columns) before the job's first
step. The coordinator learns the pooled moments only.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from xclp.client.context import PartyContext
from xclp.client.ledger import Release, function_id
from xclp.client.phases.masked_sum import MaskedSumParty, Noisy
from xclp.data.party_table import PartyData
from xclp.data.prep import Scaling, local_moments
from xclp.errors import ProtocolError
from xclp.privacy import dp_moments
from xclp.privacy.dp_moments import MomentsPlan
from xclp.privacy.dpsgd import RoundNoise
from xclp.v1 import moments, wire
from xclp.v1 import xclp_pb2 as pb
from xclp.v1.steps import MOMENTS_PURPOSE, MOMENTS_RESULT_MSG, MOMENTS_STEP


class Preparation:
    def __init__(self, ctx: PartyContext) -> None:
        self.ctx, self.params, self.data, self.progress = ctx, ctx.params, ctx.data, ctx.progress
        dim = self.data.X.shape[1]
        # with moments_epsilon (xclp.privacy.dp_moments): the clipped integer sums and this party's noise share
        self.dp: MomentsPlan | None = self.params.moments_plan(dim)
        if self.dp is not None and ctx.account is not None:  # the ledger composes runs by RDP
            ctx.account.mechanism("moments", self.dp.rdp)
        if self.dp is None:
            self.local = local_moments(self.data.X)  # float64[4, d]; refuses overflowing squares before any send
            self.own_counts = self.local[0]
        else:
            bounds = self.params.moments_ranges(dim)
            self.clipped = dp_moments.local_sums(self.data.X, bounds, self.dp.scale_bits)
            self.own_counts = self.clipped[0] >> self.dp.scale_bits
            self.noise = RoundNoise(self.dp, self.dp.cells)
            self._report_clipped(dp_moments.outside(self.data.X, bounds))
        self.sum = MaskedSumParty(ctx, MOMENTS_STEP, self._contribution, purpose=MOMENTS_PURPOSE,
                                  releases=self._releases if self.dp is None else Noisy.DP)
        self.scaling: Scaling | None = None

    @classmethod
    def restored(cls, ctx: PartyContext, scaling: Scaling) -> Preparation:
        """The preparation as a restarted party had it: done, with the pooled moments' scaling."""
        prep = cls(ctx)
        prep.scaling = scaling
        return prep

    def handles(self, step: str) -> bool:
        return self.sum.handles(step)

    def phases(self) -> tuple[MaskedSumParty, ...]:
        return (self.sum,)

    def on_step(self, step: pb.StepStart) -> None:
        self.sum.on_step(step)

    def _releases(self, members: tuple[str, ...]) -> list[Release]:
        """The exact moments release, per feature column, its count, sum and sum of squares: the
        same functions of this data whatever job, type or parameters ask for them."""
        names = self.data.columns or tuple(f"#{j + 1}" for j in range(self.data.X.shape[1]))
        return [Release(function_id("moments", name, statistic), f"the {statistic} of column {name!r}")
                for name in names for statistic in ("count", "sum", "sum of squares")]

    def _contribution(self, members: tuple[str, ...]) -> np.ndarray:
        if self.dp is None:
            self.progress(f"pushing masked feature moments ({len(members)} parties)")
            return moments.encode(self.local, len(members))
        self.progress(f"pushing masked feature moments with DP noise, ε = {self.dp.epsilon:g} ({len(members)} "
                      "parties)")
        share = self.noise.for_members(len(members))  # the same share on a restart, topped up
        return moments.encode_private(self.clipped, share, self.dp, len(members))

    def _report_clipped(self, outside: np.ndarray) -> None:
        columns = np.flatnonzero(outside)
        if columns.size:
            names = [repr(self.data.columns[j]) if self.data.columns else str(j + 1) for j in columns[:5]]
            more = f" and {columns.size - 5} more" if columns.size > 5 else ""
            self.progress(f"{int(outside.sum())} cells in {columns.size} feature column(s) ({', '.join(names)}{more}) "
                          "lie outside moments_bounds; the DP moments clip them (the table itself is not clipped)")

    def privacy(self) -> dict[str, Any] | None:
        """With DP moments, once released: their report (MomentsPlan.report)."""
        if self.dp is None or self.scaling is None:
            return None
        return self.dp.report()

    def on_message(self, message: wire.Message) -> Scaling:
        if message.step != MOMENTS_RESULT_MSG or message.sender != "":
            raise ProtocolError(f"unexpected {message.step!r} message while preparing the data")
        if self.scaling is not None:
            raise ProtocolError("the coordinator sent the pooled moments twice")
        dtype, shape = moments.wire(self.data.X.shape[1])
        payload = message.payload
        if not isinstance(payload, np.ndarray) or payload.dtype != dtype or payload.shape != shape:
            raise ProtocolError(f"the pooled moments must be {dtype.str}{list(shape)}")
        self.ctx.transcript.absorb("moments", payload)  # the pooled moments: one for all (docs/design.md §2.5)
        sums = moments.decode(payload)
        own = self.own_counts
        exact_counts = self.dp is None or not self.dp.noisy_counts
        if exact_counts and any(int(sums[0, j]) >> moments.FRAC_BITS < own[j] for j in range(own.shape[0])):
            raise ProtocolError("the pooled moments count fewer cells than this party alone holds")
        self.scaling = moments.pooled_scaling(self.params, sums, self.data.X.shape[1])
        if self.dp is not None:
            self.progress(f"pooled moments released with DP: {self.dp.describe()}")
        return self.scaling

    def prepared(self) -> PartyData:
        """The party's table with the pooled scaling applied (and its report on stderr)."""
        scaling = self.scaling
        assert scaling is not None
        data = self.data
        if scaling.impute:
            filled = np.isnan(data.X).sum(axis=0)
            for j in np.flatnonzero(filled):
                name = repr(data.columns[j]) if data.columns else f"{j + 1}"
                if scaling.kept[j]:
                    self.progress(f"filled {int(filled[j])} empty cells of column {name} with the pooled mean")
        dropped = scaling.dropped(data.columns)
        if dropped:
            self.progress(f"dropped {len(dropped)} feature columns that are constant or empty on every party: "
                          f"{', '.join(dropped)}")
        if scaling.standardise:
            self.progress(f"standardised {scaling.dim} features with the pooled mean and standard deviation")
        columns = tuple(c for c, k in zip(data.columns, scaling.kept) if k) if data.columns else ()
        return replace(data, X=scaling.apply(data.X), columns=columns)
