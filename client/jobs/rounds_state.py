"""A training party's state as values (STYLE 15; client/jobs/training.py uses them): the model chain
it follows (`Chain`) and the round it is in (`Round`), each saving itself and read back by itself.

What a party keeps of its training run to rejoin it after its process restarted (client/run_state.py
seals and writes it; client/jobs/training.py says when): the round and its model as released, the
rounds' samples, the model chain's head, the models whose sums it revealed, the round's public
values (its transcript), and, once trained, the round's update with its DP noise. In a round that
runs XCLP before its update nothing is kept until the party has its update (its pseudo-labels are
not kept); from then on the update is all the round needs. A restarted process rejoins the
round's update sum with them and masks the same update again under fresh masks (or, if the
round's sum was opened here, waits for the next round). Past rounds keep their numbers in the
party's result, not their models.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from xclp.client.phases.masked_sum import MaskedSumParty
from xclp.privacy.dpsgd import DpPlan, RoundNoise
from xclp.v1 import wire


@dataclass
class Chain:
    """The model chain as this party follows it (xclp.v1.training): the digest of the one model it
    accepts next, the round whose opened sum moved it there, and the link it recomputed in the
    current round (round, H(θ_t), H(θ_{t+1})), which it attests."""

    head: bytes | None  # None: the party never sees the model (dbcl)
    round: int = -1  # -1: θ₀
    link: tuple[int, bytes, bytes] | None = None

    def saved(self) -> dict[str, Any]:
        return {"head": None if self.head is None else self.head.hex(), "head_round": self.round}

    @classmethod
    def from_saved(cls, meta: dict[str, Any]) -> Chain:
        return cls(None if meta["head"] is None else bytes.fromhex(meta["head"]), int(meta["head_round"]))


@dataclass
class Round:
    """The round this party is in, from its model to its sum: made when the model arrives, holding
    only what is valid in it; the next round's model replaces it whole (nothing of a left round
    stays reachable through the party)."""

    t: int
    sample: frozenset[str]
    model_digest: bytes  # of the model as released (the round's transcript absorbed it)
    model_payload: wire.Payload  # the same, as it came (DBCL: the released view)
    model_in: np.ndarray | None  # the model, where the party recomputes the chain from it
    update_sum: MaskedSumParty
    started: float  # time.monotonic() when the model came
    update: tuple[np.ndarray, int] | None = None  # the update and its rows, once trained (once a round)
    noise: RoundNoise | None = None  # its distributed DP noise share, once drawn

    def saved(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        masks = self.update_sum.self_masks.revealed_attempt
        meta = {"revealed": None if masks is None else [masks[0], list(masks[1])],
                "rows": None if self.update is None else self.update[1],
                # the round's public values (its model; in an XCLP round, its layouts and pairs too)
                "round_transcript": self.update_sum.ctx.transcript.state(),
                "noise_variance": None if self.noise is None else self.noise.variance}
        arrays: dict[str, np.ndarray] = {}
        if isinstance(self.model_payload, np.ndarray):
            arrays["model"] = self.model_payload
        if self.update is not None:
            arrays["update"] = self.update[0]
        if self.noise is not None and self.noise.share is not None:
            arrays["noise"] = self.noise.share
        return meta, arrays

    def restore(self, meta: dict[str, Any], arrays: dict[str, np.ndarray], dp: DpPlan | None) -> None:
        """What `saved` kept, into this round as made again from its model (the round's transcript,
        the update and its noise, the attempt whose self mask was revealed)."""
        if meta.get("round_transcript") is not None:
            self.update_sum.ctx.transcript.take(meta["round_transcript"])
        if meta["rows"] is not None:
            self.update = (arrays["update"], int(meta["rows"]))
        if meta["noise_variance"] is not None and dp is not None:
            self.noise = RoundNoise(dp, arrays["update"].shape[0])
            self.noise.share, self.noise.variance = arrays["noise"], float(meta["noise_variance"])
        if meta["revealed"] is not None:
            self.update_sum.self_masks.revealed_attempt = (int(meta["revealed"][0]), tuple(meta["revealed"][1]))
