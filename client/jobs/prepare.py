"""A party's side of the "moments" step (DESIGN §8): its local (n, Σx, Σx²) per feature, masked
and self-masked like every sum (DESIGN §6.1), and the pooled scaling it gets back.

The coordinator learns the pooled moments only; this party applies the resulting `Scaling` to its
own table (impute, standardise, drop constant columns) before the job's first step.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from xclp.client.jobs.selfmask import SelfMasks
from xclp.client.jobs.xclp import Pusher
from xclp.crypto.masking import PairwiseMasker
from xclp.errors import ProtocolError
from xclp.prep import Scaling, local_moments
from xclp.party_table import PartyData
from xclp.v1 import moments, wire
from xclp.v1 import xclp_pb2 as pb
from xclp.v1.jobs import JobParams
from xclp.v1.steps import MOMENTS_PURPOSE, MOMENTS_RESULT_MSG, MOMENTS_STEP


@dataclass
class Preparation:
    party_id: str
    params: JobParams
    data: PartyData
    masker: PairwiseMasker
    conn: Pusher
    progress: Callable[[str], None]
    scaling: Scaling | None = None
    self_masks: SelfMasks | None = None

    def __post_init__(self) -> None:
        self.self_masks = SelfMasks(MOMENTS_STEP, self.masker.session_id)
        self.local = local_moments(self.data.X)  # float64[3, d]; refuses overflowing squares before any send

    def on_step(self, step: pb.StepStart) -> None:
        assert self.self_masks is not None
        members = list(step.participants)
        if step.step == moments.REVEAL_STEP:
            self.conn.push(self.self_masks.reveal(step.round, members), sender=self.party_id, step=step.step,
                           round=step.round)
            return
        encoded = moments.encode(self.local, len(members))
        masked = self.masker.apply(encoded, purpose=MOMENTS_PURPOSE, round=step.round, participants=members)
        self.conn.push(self.self_masks.add(masked, step.round, members), sender=self.party_id, step=MOMENTS_STEP,
                       round=step.round)
        self.progress(f"pushed masked feature moments for round {step.round} ({len(members)} parties)")

    def on_message(self, message: wire.Message) -> Scaling:
        if message.step != MOMENTS_RESULT_MSG or message.sender != "":
            raise ProtocolError(f"unexpected {message.step!r} message while preparing the data")
        if self.scaling is not None:
            raise ProtocolError("the coordinator sent the pooled moments twice")
        dtype, shape = moments.wire(self.data.X.shape[1])
        payload = message.payload
        if not isinstance(payload, np.ndarray) or payload.dtype != dtype or payload.shape != shape:
            raise ProtocolError(f"the pooled moments must be {dtype.str}{list(shape)}")
        sums = moments.decode(payload)
        own = self.local[0]
        if any(int(sums[0, j]) >> moments.FRAC_BITS < own[j] for j in range(own.shape[0])):
            raise ProtocolError("the pooled moments count fewer cells than this party alone holds")
        self.scaling = Scaling.from_sums(sums, moments.FRAC_BITS, standardise=self.params.standardise,
                                         impute=self.params.impute == "mean")
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
