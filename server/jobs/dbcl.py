"""Double-blind collaborative learning (`type = "dbcl"`, DESIGN §7, paper 004 §4.2) on the coordinator.

After SETUP (and the moments step if the job prepares), rounds t = 0 .. rounds − 1:

    P_t = the job's public sample of round t, less dropped parties
    seed_t = 32 fresh random bytes; S_t of each sketched layer from it (xclp.dbcl.draw_sketches)
    coordinator -> P_t  "r<t>.seed" seed_t, "r<t>.model" the released parameters (W̃ = S_tᵀW or W, b)
    r<t>.update --> r<t>.update_reveal --> W ← step(W, S_t Σ_j b_j ∂ℓ/∂W̃_j / Σ_j b_j)
After the last round: "final_model" W to every party (float64[0] if the job withholds it), and W
to the job's `model` file if it names one.

The rounds, their sample and their dropouts are the fedavg job's (server/jobs/fedavg.py): a party
that leaves is dropped, one that misses a deadline sits the round out, a lost reveal or a round
below min_parties is skipped and W stays. The coordinator holds W and sees the sum of each
round's sketched gradients, never one party's; the parties see only W̃ (unless W is sent at the end).
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable, Mapping

import numpy as np

from xclp.crypto.identity import KeyBundle
from xclp.dbcl import RoundView, ServerOptimiser, draw_sketches, server_step, view_size
from xclp.errors import InvalidInput
from xclp.server.config import JobConfig
from xclp.server.jobs.base import Observer
from xclp.server.jobs.fedavg import FedavgJob
from xclp.sketch import Sketch
from xclp.v1 import dbcl, fedavg
from xclp.v1.jobs import DbclJobParams

log = logging.getLogger("xclp.server")


class DbclJob(FedavgJob):
    """Rounds of one fresh sketch each, the released parameters, and one masked gradient sum."""

    params_type = DbclJobParams

    def __init__(self, config: JobConfig, allow_list: Mapping[str, bytes], *,
                 clock: Callable[[], float] = time.monotonic, observer: Observer | None = None) -> None:
        super().__init__(config, allow_list, clock=clock, observer=observer)
        self.params: DbclJobParams = config.params  # type: ignore[assignment]
        self.optimiser: ServerOptimiser = self.params.server_optimiser()
        self.sketches: dict[int, Sketch] = {}  # this round's S_t

    def check_claimed_bundle(self, claimed: KeyBundle) -> None:
        """No Paillier key: a dbcl job only adds masked vectors."""

    def check_start(self) -> None:
        if not any(p.summary.labeled_rows for p in self.parties.values()):
            raise InvalidInput("no party brought a labeled row: there is nothing to train on")
        self.params.sizes(self.dim)  # every sketched layer fits the data's columns

    def _open_round(self, t: int) -> None:
        assert self.net is not None
        seed = self.fresh_seed(t)
        self.sketches = draw_sketches(self.net.arch, self.params.layers, self.params.sketch, self.params.sizes(self.dim),
                                      seed)
        released = RoundView.release(self.net, self.sketches).flat()
        for pid in self.members:
            self.send(pid, fedavg.scoped(t, dbcl.SEED_MSG), 0, seed)
            self.send(pid, fedavg.scoped(t, fedavg.MODEL_MSG), 0, released)
        self._start_update(self.members, 0)

    def fresh_seed(self, t: int) -> bytes:
        """Round t's seed: fresh randomness every round (a repeated S would not hide W's difference)."""
        return secrets.token_bytes(dbcl.SEED_BYTES)

    def _apply_sum(self, total: np.ndarray) -> int:
        assert self.net is not None
        summed, rows = fedavg.decode_update(total, self.params.frac_bits)
        self.net = server_step(self.net, self.sketches, summed, rows, self.optimiser)
        return rows

    def _final_payload(self) -> np.ndarray:
        assert self.net is not None
        return np.empty(0) if self.params.withhold_model else self.net.flat

    def _update_len(self) -> int:
        return view_size(self.params.architecture(self.dim), self.params.sizes(self.dim))
