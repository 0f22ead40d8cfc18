"""Double-blind collaborative learning (`type = "dbcl"`, docs/design.md §7, Zhang & Wang 2021 §4.2) on the
coordinator: the trainer of the rounds engine (server/jobs/training.py).

Round t: 32 fresh random bytes seed_t, and from them S_t of each sketched layer
(xclp.dbcl.draw_sketches); "r<t>.seed" seed_t and "r<t>.model" the released parameters
(W̃ = S_tᵀW or W, b) to the round's parties; the opened update sum Σ_j b_j ∂ℓ/∂W̃_j steps W by
S_t times its mean (SGD with momentum or RMSProp). After the last round the parties get W, or an
empty model when the job withholds it. The coordinator holds W and sees the sum of each round's
sketched gradients, never one party's; the parties see only W̃ (unless W is sent at the end).
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping

import numpy as np

from xclp.dbcl import RoundView, ServerOptimiser, draw_sketches, server_step, view_size
from xclp.errors import InvalidInput
from xclp.fedavg import initial_network
from xclp.nn import Network
from xclp.server.config import JobConfig
from xclp.server.jobs.training import RoundsJob
from xclp.server.mailbox import Party
from xclp.server.phases.base import Program, Scope
from xclp.sketch import Sketch
from xclp.v1 import dbcl, training
from xclp.v1.dbcl import DbclJobParams


class DbclTrainer:
    verifiable = False  # the parties never see W (docs/threat-model.md: what a coordinator can still do)

    def __init__(self, config: JobConfig) -> None:
        assert isinstance(config.params, DbclJobParams)
        self.params = config.params
        self.optimiser: ServerOptimiser = self.params.server_optimiser()
        self.net: Network | None = None
        self.sizes: dict[int, int] = {}
        self.sketches: dict[int, Sketch] = {}  # this round's S_t
        self.seed = b""  # this round's seed_t
        self.view = np.empty(0)  # this round's released view W̃ = S_tᵀW (and b), as every party gets it
        self.replay: bytes | None = None  # a restarted coordinator's round: the seed it had (its parties hold it)

    def check_start(self, parties: Mapping[str, Party]) -> None:
        """Every check is the schema's (labels, sketch sizes): nothing more."""

    def begin(self, dim: int) -> Network:
        self.net = initial_network(self.params.architecture(dim), self.params.seed)
        self.sizes = self.params.sizes(dim)
        return self.net

    def round(self, scope: Scope, t: int, *, again: bool = False) -> Program[tuple[str, ...]]:
        yield from ()  # no phase of its own before the update (again: the seed `restored` kept)
        assert self.net is not None
        seed = self.seed = self.fresh_seed(t) if self.replay is None else self.replay
        self.replay = None
        self.sketches = draw_sketches(self.net.arch, self.params.layers, self.params.sketch, self.sizes, seed)
        self.view = RoundView.release(self.net, self.sketches).flat()
        for pid in scope.members:
            self.resend(scope, pid)
        return tuple(scope.members)

    def resend(self, scope: Scope, party: str) -> None:
        """The round's seed and view (W has not moved in the round)."""
        scope.send(party, dbcl.SEED_MSG, 0, self.seed)
        scope.send(party, training.MODEL_MSG, 0, self.view)

    def fresh_seed(self, t: int) -> bytes:
        """Round t's seed: fresh randomness every round (a repeated S would not hide W's difference)."""
        return secrets.token_bytes(dbcl.SEED_BYTES)

    def update_size(self) -> int:
        assert self.net is not None
        return view_size(self.net.arch, self.sizes)

    def apply(self, total: np.ndarray) -> int:
        assert self.net is not None
        summed, rows = self.params.decode_sum(total, self.update_size())
        self.net = server_step(self.net, self.sketches, summed, rows, self.optimiser)
        return rows

    def final_payload(self) -> np.ndarray:
        assert self.net is not None
        return np.empty(0) if self.params.withhold_model else self.net.flat

    def saved(self, t: int) -> dict[str, np.ndarray]:
        """W, the optimiser's state and round t's seed: the round again releases the same view, which
        its parties hold already (the seed is theirs to see; W and the state are the coordinator's)."""
        assert self.net is not None
        state = self.optimiser.state
        return {"theta": self.net.flat.copy(), "seed": np.frombuffer(self.seed, dtype=np.uint8).copy(),
                "optimiser": np.zeros(0) if state is None else state.copy()}

    def restored(self, dim: int, arrays: Mapping[str, np.ndarray]) -> None:
        self.begin(dim)
        self.net = Network(self.params.architecture(dim), arrays["theta"])  # checks its shape and values
        seed, state = bytes(np.asarray(arrays["seed"], dtype=np.uint8)), np.asarray(arrays["optimiser"])
        if len(seed) != dbcl.SEED_BYTES or state.shape not in ((0,), self.net.flat.shape):
            raise InvalidInput("the saved round seed or optimiser state does not fit this job's network")
        self.replay, self.optimiser.state = seed, (state.astype(np.float64) if state.size else None)


def dbcl_job(config: JobConfig) -> RoundsJob:
    return RoundsJob(config, DbclTrainer(config))
