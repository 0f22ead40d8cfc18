"""Federated averaging on the party's side (docs/design.md §7, Scott et al. 2023 Alg. 2): the trainer of the
rounds engine (client/jobs/training.py); its counterpart is server/jobs/fedavg.py.

Round t: "r<t>.model" brings θ; with pseudo_label = "xclp" the party embeds its rows with f_φ and
runs one XCLP job among the round's parties (an `XclpParty` on the embedded rows in the round's
scope: its steps, masks and seed the round's, its Paillier key the job's); the update trains E
epochs from θ on labeled rows and pseudo-labeled rows (weight ω) and adds n_j·(θ_j − θ) and n_j to
the round's masked sum.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from xclp.client.context import PartyContext, RelayedPhase
from xclp.client.jobs.training import RoundRecord, RoundsParty
from xclp.client.jobs.xclp import XclpParty
from xclp.data.party_table import PartyData
from xclp.data.validation import UNLABELED
from xclp.errors import InvalidInput, ProtocolError
from xclp.fedavg import (
    PseudoLabels,
    client_update,
    initial_network,
    local_pseudo_labels,
    local_rng,
    private_client_update,
    server_update,
    training_set,
)
from xclp.nn import Network
from xclp.v1 import training, wire
from xclp.v1 import xclp_pb2 as pb
from xclp.v1.fedavg import FedavgJobParams


class FedavgTrainer:
    def __init__(self, ctx: PartyContext) -> None:
        self.ctx = ctx
        self.params = ctx.params_as(FedavgJobParams)
        self.arch = self.params.architecture(ctx.data.X.shape[1])
        self.y = ctx.data.y if ctx.data.y is not None else np.full(ctx.data.X.shape[0], UNLABELED, dtype=np.int64)
        self.round = -1
        self.model: Network | None = None  # θ of the current round
        self.xclp: XclpParty | None = None  # the current round's XCLP run, if it pseudo-labels with XCLP

    def open_round(self, scope: PartyContext, t: int, payload: wire.Payload) -> None:
        self.round, self.xclp = t, None
        self.model = self._model(payload, f"the model of round {t}")
        if self.params.pseudo_labels_in(t) == "xclp":
            if self.ctx.keypair is None:
                raise InvalidInput("pseudo_label = \"xclp\" needs this party's Paillier key")
            embedded = PartyData(self.params.neighbour_space(self.model, self.ctx.data.X), self.y, self.ctx.data.ids)
            self.xclp = XclpParty(scope.with_job(self.params.xclp_params(), embedded))

    def phases(self) -> tuple[RelayedPhase, ...]:
        return () if self.xclp is None else tuple(self.xclp.phases())

    def on_step(self, t: int, step: pb.StepStart) -> None:
        if self.xclp is None:
            raise ProtocolError(f"step {step.step!r}: round {t} runs no XCLP")
        self.xclp.on_step(step)

    def on_message(self, t: int, message: wire.Message) -> None:
        if t != self.round or self.xclp is None:
            who = f"{message.sender!r}" if message.sender else "the coordinator"
            raise ProtocolError(f"{who} sent {training.scoped(t, message.step)!r} outside this round's XCLP run")
        self.xclp.on_message(message)

    def train(self, t: int, started: float) -> tuple[np.ndarray, int, RoundRecord]:
        """ClientUpdate from θ: n_j·(θ_j − θ) and n_j."""
        assert self.model is not None
        pseudo = self._pseudo_labels()  # XCLP's ran between the model and this step
        labeled_at = time.monotonic()
        p, data, rng = self.params, training_set(self.ctx.data.X, self.y, pseudo), local_rng(self.ctx.seed,
                                                                                            self.ctx.party_id, t)
        dp = p.dp_plan(self.update_size())
        if dp is None:
            vector, rows = client_update(self.model, data, p.optimiser, rng)
        else:
            vector, rows = private_client_update(self.model, data, p.learning_rate, p.batch_size, p.dp_local_steps,
                                                 dp, rng)
        record = RoundRecord(t, self.model.flat.copy(), pseudo, rows, labeled_at - started,
                             time.monotonic() - labeled_at)
        return vector, rows, record

    verifiable = True

    def update_size(self) -> int:
        return self.arch.n_params

    def model_bytes(self) -> int:
        return self.arch.n_params * 8

    def payload_limit(self, t: int, name: str, sender: str) -> int:
        if t != self.round or self.xclp is None:
            raise ProtocolError(f"{sender or 'the coordinator'!r} sent {training.scoped(t, name)!r} outside this "
                                "round's XCLP run")
        return self.xclp.payload_limit(name, sender)

    def next_model(self, total: np.ndarray) -> np.ndarray:
        """θ moved by the opened sum exactly as the coordinator moves it (server/jobs/fedavg.py)."""
        assert self.model is not None
        delta, rows = self.params.weighted_delta(total, self.arch.n_params)
        return server_update(self.model, delta, rows).flat

    def state(self) -> dict[str, Any] | None:
        """Nothing beyond the round's model; None in a round that runs XCLP (rejoined only once the
        party has its update, which client/jobs/rounds_state.py keeps)."""
        return None if self.xclp is not None else {}

    def restore(self, state: dict[str, Any]) -> None:
        """Nothing to restore: the round's model opens the round again."""

    def initial_model(self) -> np.ndarray:
        """θ₀ as the coordinator draws it (server/jobs/fedavg.py), from the job's parameters."""
        return initial_network(self.arch, self.params.seed).flat

    def describe(self, record: RoundRecord) -> str:
        return (f"pseudo-labels in {record.pseudo_seconds:.2f}s, trained on {record.rows} rows in "
                f"{record.train_seconds:.2f}s")

    def final(self, payload: wire.Payload) -> np.ndarray:
        final = self._model(payload, "the final model").flat
        self.ctx.progress(f"final model received ({self.arch.n_params} parameters)")
        return final

    def _pseudo_labels(self) -> PseudoLabels | None:
        assert self.model is not None
        kind = self.params.pseudo_labels_in(self.round)
        if kind != "xclp":
            return local_pseudo_labels(kind, self.model, self.ctx.data.X, self.y, self.params.n_classes,
                                       self.params.graph_params, self.params.pseudo_label_space)
        if self.xclp is None or self.xclp.result is None:
            raise ProtocolError(f"the update of round {self.round} started before this party had its XCLP "
                                "pseudo-labels")
        labels, confidence = self.xclp.predictions()
        unlabeled = self.y == UNLABELED
        return PseudoLabels(labels[unlabeled], confidence[unlabeled])

    def _model(self, payload: wire.Payload, what: str) -> Network:
        try:
            return Network(self.arch, training.model_payload(payload, self.arch.n_params, what))
        except InvalidInput as exc:
            raise ProtocolError(str(exc)) from None


class FedavgParty(RoundsParty):
    def __init__(self, ctx: PartyContext) -> None:
        super().__init__(ctx, FedavgTrainer(ctx))
