"""A party's side of the dbcl job (DESIGN §7, paper 004 §4.2; server/jobs/dbcl.py, xclp.v1.dbcl).

Round t: "r<t>.seed" brings the round's seed and "r<t>.model" the released parameters (W̃ = S_tᵀW
for sketched layers); the party draws S_t from the seed, runs the sketched forward and backward
on a batch of its labeled rows (E batches with `local_steps`), and pushes b·∂ℓ/∂(W̃, b) and b
double-masked; "r<t>.update_reveal" opens the round. It never sees W, unless the job sends it at
the end.

What the party checks, beyond the fedavg party's checks (public sample, rounds only forward, one
training per round, the self-mask rules):
- every round's seed is new to this job: a repeated S_t would let parties difference W̃ across
  rounds (paper 004 §4.4);
- the released parameters have exactly the shapes the job's public parameters give;
- the final message is W, or empty when the job withholds W — nothing else.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from xclp.client.jobs.fedavg import FedavgParty, RoundRecord
from xclp.dbcl import RoundView, client_gradient, draw_sketches
from xclp.errors import InvalidInput, ProtocolError
from xclp.fedavg import local_rng
from xclp.v1 import dbcl, fedavg, wire
from xclp.v1.jobs import DbclJobParams


@dataclass
class DbclParty(FedavgParty):
    params: DbclJobParams  # type: ignore[assignment]
    view: RoundView | None = None  # this round's released parameters
    seeds: dict[int, bytes] = field(default_factory=dict)  # round -> seed, every seed this job sent

    def __post_init__(self) -> None:
        super().__post_init__()
        self.sizes = self.params.sizes(self.data.X.shape[1])

    def on_message(self, message: wire.Message) -> None:
        scope = fedavg.unscope(message.step)
        if message.sender == "" and scope is not None and scope[1] == dbcl.SEED_MSG:
            self._seed(scope[0], message.payload)
            return
        if message.sender != "":
            raise ProtocolError(f"{message.sender!r} sent a {message.step!r} message; in a dbcl job only the "
                                "coordinator sends")
        super().on_message(message)

    def _seed(self, t: int, payload: wire.Payload) -> None:
        if t <= self.round or t in self.seeds:
            raise ProtocolError(f"the seed of round {t} came after round {self.round} had started")
        try:
            seed = dbcl.round_seed_payload(payload, t)
        except InvalidInput as exc:
            raise ProtocolError(str(exc)) from None
        if seed in self.seeds.values():
            raise ProtocolError(f"round {t} reuses the sketch seed of an earlier round: a repeated sketch would "
                                "not hide the change of the model (paper 004 §4.4), so this party stops")
        self.seeds[t] = seed

    def _open_round(self, t: int, payload: wire.Payload) -> None:
        seed = self.seeds.get(t)
        if seed is None:
            raise ProtocolError(f"the parameters of round {t} came without the round's seed")
        sketches = draw_sketches(self.arch, self.params.layers, self.params.sketch, self.sizes, seed)
        try:
            self.view = RoundView.from_flat(self.arch, sketches, payload)  # type: ignore[arg-type]
        except InvalidInput as exc:
            raise ProtocolError(f"the released parameters of round {t}: {exc}") from None

    def _train(self) -> tuple[np.ndarray, int]:
        assert self.view is not None
        started = time.monotonic()
        update = client_gradient(self.view, self.data.X, self.y, self.params.batch_size, self.params.local_steps,
                                 self.params.learning_rate, local_rng(self.seed, self.party_id, self.round))
        self.history.append(RoundRecord(self.round, self.view.flat(), None, update[1], 0.0, time.monotonic() - started,
                                        self.seeds[self.round]))
        return update

    def _trained(self) -> str:
        record = self.history[-1]
        return f"sketched gradient on {record.rows} labeled rows in {record.train_seconds:.2f}s"

    def _final(self, payload: wire.Payload) -> None:
        if self.params.withhold_model:
            if not isinstance(payload, np.ndarray) or payload.dtype != np.float64 or payload.shape != (0,):
                raise ProtocolError("the job withholds the model, but the final message is not empty")
            self.result = payload
            self.progress("training done; the job withholds the model from the parties")
            return
        super()._final(payload)
