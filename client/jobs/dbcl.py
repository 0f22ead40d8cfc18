"""Double-blind collaborative learning on the party's side (docs/design.md §7, Zhang & Wang 2021 §4.2): the
trainer of the rounds engine (client/jobs/training.py); its counterpart is server/jobs/dbcl.py.

Round t: "r<t>.seed" brings the round's seed and "r<t>.model" the released parameters (W̃ = S_tᵀW
for sketched layers); the party draws S_t from the seed, runs the sketched forward and backward
on a batch of its labeled rows (E batches with `local_steps`), and adds b·∂ℓ/∂(W̃, b) and b to
the round's masked sum. It never sees W, unless the job sends it at the end.

What the party checks, beyond the rounds engine's checks:
- every round's seed is new to this job: a repeated S_t would let parties difference W̃ across
  rounds (Zhang & Wang 2021 §4.4); only the current round's own seed may come again, when a restarted
  coordinator runs the round again from its start (with the same released model: the rounds
  engine checks it);
- the released parameters have exactly the shapes the job's public parameters give;
- the final message is W, or empty when the job withholds W — nothing else.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from xclp.client.context import PartyContext, RelayedPhase
from xclp.client.jobs.training import RoundRecord, RoundsParty
from xclp.data.validation import UNLABELED
from xclp.dbcl import RoundView, client_gradient, draw_sketches, private_client_gradient
from xclp.errors import InvalidInput, ProtocolError
from xclp.fedavg import local_rng
from xclp.nn import Network
from xclp.v1 import dbcl, training, wire
from xclp.v1 import xclp_pb2 as pb
from xclp.v1.dbcl import DbclJobParams


class DbclTrainer:
    def __init__(self, ctx: PartyContext) -> None:
        self.ctx = ctx
        self.params = ctx.params_as(DbclJobParams)
        dim = ctx.data.X.shape[1]
        self.arch, self.sizes = self.params.architecture(dim), self.params.sizes(dim)
        self.y = ctx.data.y if ctx.data.y is not None else np.full(ctx.data.X.shape[0], UNLABELED, dtype=np.int64)
        self.round = -1
        self.view: RoundView | None = None  # this round's released parameters
        self.seeds: dict[int, bytes] = {}  # round -> seed, every seed this job sent

    def on_message(self, t: int, message: wire.Message) -> None:
        if message.sender != "":
            raise ProtocolError(f"{message.sender!r} sent a {message.step!r} message; in a dbcl job only the "
                                "coordinator sends")
        if message.step != dbcl.SEED_MSG:
            raise ProtocolError(f"the coordinator sent an unknown {training.scoped(t, message.step)!r} message")
        try:
            seed = dbcl.round_seed_payload(message.payload, t)
        except InvalidInput as exc:
            raise ProtocolError(str(exc)) from None
        if t >= self.round and self.seeds.get(t) == seed:
            return  # the round again from its start (a restarted coordinator): its model must be the same too
        if t <= self.round or t in self.seeds:
            raise ProtocolError(f"the seed of round {t} came after round {self.round} had started")
        if seed in self.seeds.values():
            raise ProtocolError(f"round {t} reuses the sketch seed of an earlier round: a repeated sketch would "
                                "not hide the change of the model (Zhang & Wang 2021 §4.4), so this party stops")
        self.seeds[t] = seed

    def open_round(self, scope: PartyContext, t: int, payload: wire.Payload) -> None:
        self.round = t
        seed = self.seeds.get(t)
        if seed is None:
            raise ProtocolError(f"the parameters of round {t} came without the round's seed")
        scope.transcript.absorb("seed", seed)  # public to the round's parties (docs/design.md §2.5)
        sketches = draw_sketches(self.arch, self.params.layers, self.params.sketch, self.sizes, seed)
        if not isinstance(payload, np.ndarray):
            raise ProtocolError(f"the released parameters of round {t} must be an array")
        try:
            self.view = RoundView.from_flat(self.arch, sketches, payload)
        except InvalidInput as exc:
            raise ProtocolError(f"the released parameters of round {t}: {exc}") from None

    def phases(self) -> tuple[RelayedPhase, ...]:
        return ()  # the round's update sum is the rounds engine's

    def on_step(self, t: int, step: pb.StepStart) -> None:
        raise ProtocolError(f"unknown step {training.scoped(t, step.step)!r} for a dbcl job")

    def train(self, t: int, started: float) -> tuple[np.ndarray, int, RoundRecord]:
        assert self.view is not None
        began = time.monotonic()
        p, rng = self.params, local_rng(self.ctx.seed, self.ctx.party_id, t)
        dp = p.dp_plan(self.update_size())
        if dp is None:
            vector, rows = client_gradient(self.view, self.ctx.data.X, self.y, p.batch_size, p.local_steps,
                                           p.learning_rate, rng)
        else:
            vector, rows = private_client_gradient(self.view, self.ctx.data.X, self.y, p.batch_size, p.local_steps,
                                                   p.learning_rate, dp, rng)
        record = RoundRecord(t, self.view.flat(), None, rows, 0.0, time.monotonic() - began, self.seeds[t])
        return vector, rows, record

    verifiable = False  # the party never sees W

    def update_size(self) -> int:
        return self.params.update_size(self.ctx.data.X.shape[1])

    def model_bytes(self) -> int:
        return self.arch.n_params * 8  # a view is at most the network (sketch_ratio <= 1), the final W it

    def payload_limit(self, t: int, name: str, sender: str) -> int:
        if sender != "" or name != dbcl.SEED_MSG:
            raise ProtocolError(f"{sender or 'the coordinator'!r} sent a {training.scoped(t, name)!r} message, which "
                                "a dbcl job never sends")
        return dbcl.SEED_BYTES

    def next_model(self, total: np.ndarray) -> None:
        return None

    def initial_model(self) -> None:
        return None  # the party never sees W: only DP defends DBCL across rounds (client/policy.py)

    def state(self) -> dict[str, Any]:
        """Every seed this job sent (a restarted process refuses a repeated one all the same)."""
        return {"seeds": {str(t): seed.hex() for t, seed in self.seeds.items()}}

    def restore(self, state: dict[str, Any]) -> None:
        self.seeds = {int(t): bytes.fromhex(seed) for t, seed in state["seeds"].items()}

    def describe(self, record: RoundRecord) -> str:
        return f"sketched gradient on {record.rows} labeled rows in {record.train_seconds:.2f}s"

    def final(self, payload: wire.Payload) -> np.ndarray:
        if self.params.withhold_model:
            if not isinstance(payload, np.ndarray) or payload.dtype != np.float64 or payload.shape != (0,):
                raise ProtocolError("the job withholds the model, but the final message is not empty")
            self.ctx.progress("training done; the job withholds the model from the parties")
            return payload
        try:
            final = Network(self.arch, training.model_payload(payload, self.arch.n_params, "the final model")).flat
        except InvalidInput as exc:
            raise ProtocolError(str(exc)) from None
        self.ctx.progress(f"final model received ({self.arch.n_params} parameters)")
        return final


class DbclParty(RoundsParty):
    def __init__(self, ctx: PartyContext) -> None:
        super().__init__(ctx, DbclTrainer(ctx))
