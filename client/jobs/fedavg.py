"""A party's side of the federated training job (DESIGN §7, paper 003 Alg. 2; server/jobs/fedavg.py).

Round t, in the round's scope (xclp.v1.fedavg): "r<t>.model" brings θ; with pseudo_label = "xclp"
the party embeds its rows with f_φ and runs one XCLP job among the round's parties (a fresh
`XclpParty` on the embedded rows, its steps and masks under the round's session id, its Paillier
key the job's); "r<t>.update" trains E epochs from θ on labeled rows and pseudo-labeled rows
(weight ω) and pushes n_j·(θ_j − θ) and n_j double-masked; "r<t>.update_reveal" opens the round.

What the party checks, whatever the coordinator says (DESIGN §2):
- every step of round t names only parties of the job's public sample of round t, so a
  coordinator cannot choose the sets it would difference; rounds only move forward;
- one training per round: a restarted update sends the same update under fresh masks;
- the self-mask rules of DESIGN §6.1 within each round (client/jobs/selfmask.py).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Executor
from dataclasses import dataclass, field

import numpy as np

from xclp.client.jobs.selfmask import SelfMasks
from xclp.client.jobs.xclp import Pusher, XclpParty
from xclp.crypto.identity import Roster
from xclp.crypto.masking import PairwiseMasker
from xclp.crypto.paillier import PaillierKeypair
from xclp.errors import InvalidInput, ProtocolError
from xclp.fedavg import (PseudoLabels, client_update, local_pseudo_labels, local_rng, round_seed, sample_parties,
                         training_set)
from xclp.nn import Network
from xclp.party_table import PartyData
from xclp.v1 import fedavg, wire
from xclp.v1 import xclp_pb2 as pb
from xclp.v1.jobs import FedavgJobParams
from xclp.validation import UNLABELED


@dataclass
class ScopedPusher:
    """Pushes a round's XCLP payloads under the round's step names."""

    conn: Pusher
    round: int

    def push(self, payload: wire.Payload, *, sender: str, step: str, round: int, recipient: str = "") -> int:
        return self.conn.push(payload, sender=sender, step=fedavg.scoped(self.round, step), round=round,
                              recipient=recipient)


@dataclass(frozen=True)
class RoundRecord:
    """What this party saw of round t: θ as received, its pseudo-labels (None: none), rows trained on,
    and seconds spent on pseudo-labels and on training (DbclParty: the released parameters, its seed)."""

    round: int
    model_in: np.ndarray
    pseudo: PseudoLabels | None
    rows: int
    pseudo_seconds: float
    train_seconds: float
    seed: bytes = b""  # dbcl: the round's sketch seed (model_in is then the released W̃, b)


@dataclass
class FedavgParty:
    party_id: str
    params: FedavgJobParams
    data: PartyData
    keypair: PaillierKeypair | None
    roster: Roster
    seed: bytes
    masker: PairwiseMasker
    conn: Pusher
    progress: Callable[[str], None]
    executor: Executor | None = None
    max_paillier_seconds: float = 0.0
    round: int = -1
    model: Network | None = None  # θ of the current round
    xclp: XclpParty | None = None
    update: tuple[np.ndarray, int] | None = None  # this round's n_j·(θ_j − θ) and n_j, once trained
    self_masks: SelfMasks | None = None
    round_masker: PairwiseMasker | None = None  # pairwise masks under the round's session id
    sample: frozenset[str] = frozenset()  # the round's public sample of parties
    history: list[RoundRecord] = field(default_factory=list)
    result: np.ndarray | None = None  # the final θ
    _round_started: float = 0.0  # when this round's model arrived

    def __post_init__(self) -> None:
        self.arch = self.params.architecture(self.data.X.shape[1])
        self.y = self.data.y if self.data.y is not None else np.full(self.data.X.shape[0], UNLABELED, dtype=np.int64)

    # --- transitions ------------------------------------------------------------------------

    def on_message(self, message: wire.Message) -> None:
        scope = fedavg.unscope(message.step)
        if message.sender != "":
            if scope is not None and scope[0] < self.round:
                return  # a relay of an earlier round, which this party has left
            if scope is not None and scope[0] == self.round and self.xclp is not None:
                self.xclp.on_message(dataclasses.replace(message, step=scope[1]))
                return
            raise ProtocolError(f"{message.sender!r} sent a {message.step!r} message outside this round's XCLP run")
        if message.step == fedavg.FINAL_MSG:
            self._final(message.payload)
            return
        if scope is None:
            raise ProtocolError(f"the coordinator sent an unknown {message.step!r} message")
        t, name = scope
        if name == fedavg.MODEL_MSG:
            self._start_round(t, message.payload)
        elif t != self.round or self.xclp is None:
            raise ProtocolError(f"the coordinator sent {message.step!r} outside this round's XCLP run")
        else:
            self.xclp.on_message(dataclasses.replace(message, step=name))

    def on_step(self, step: pb.StepStart) -> None:
        scope = fedavg.unscope(step.step)
        if scope is None:
            raise ProtocolError(f"unknown step {step.step!r} for a fedavg job")
        t, name = scope
        if t != self.round:
            raise ProtocolError(f"step {step.step!r} started, but this party is in round {self.round}")
        self._check_sample(t, step.participants)
        if name == fedavg.UPDATE_STEP:
            self._push_update(step)
        elif name == fedavg.UPDATE_REVEAL:
            assert self.self_masks is not None
            self.conn.push(self.self_masks.reveal(step.round, list(step.participants)), sender=self.party_id,
                           step=step.step, round=step.round)
        elif self.xclp is not None:
            self.xclp.on_step(pb.StepStart(step=name, round=step.round, participants=step.participants,
                                           deadline_seconds=step.deadline_seconds))
        else:
            raise ProtocolError(f"step {step.step!r}: round {t} runs no XCLP")

    # --- a round ----------------------------------------------------------------------------

    def _start_round(self, t: int, payload: wire.Payload) -> None:
        if t <= self.round:
            raise ProtocolError(f"round {t} started after round {self.round}: rounds only move forward")
        if t >= self.params.rounds:
            raise ProtocolError(f"round {t} started, but the job has {self.params.rounds} rounds")
        self.sample = frozenset(sample_parties(self.params.seed, t, self.roster.party_ids, self.params.fraction))
        self._check_sample(t, [self.party_id])
        self.round, self.update, self.xclp = t, None, None
        session = fedavg.round_session(self.masker.session_id, t)
        self.round_masker = PairwiseMasker(self.party_id, self.masker.secrets, session)
        self.self_masks = SelfMasks(fedavg.scoped(t, fedavg.UPDATE_STEP), session)
        self._round_started = time.monotonic()
        self._open_round(t, payload)
        self.progress(f"round {t}: model received")

    def _open_round(self, t: int, payload: wire.Payload) -> None:
        """θ of round t, and with pseudo_label = "xclp" the round's XCLP party."""
        self.model = self._model(payload, f"the model of round {t}")
        if self.params.pseudo_labels_in(t) == "xclp":
            if self.keypair is None:
                raise InvalidInput("pseudo_label = \"xclp\" needs this party's Paillier key")
            embedded = PartyData(self.model.embed(self.data.X), self.y, self.data.ids)
            self.xclp = XclpParty(self.party_id, self.params.xclp_params(), embedded, self.keypair, self.roster,
                                  round_seed(self.seed, t), self.round_masker, ScopedPusher(self.conn, t),
                                  self.progress, executor=self.executor, max_paillier_seconds=self.max_paillier_seconds)

    def _pseudo_labels(self) -> PseudoLabels | None:
        assert self.model is not None
        kind = self.params.pseudo_labels_in(self.round)
        if kind != "xclp":
            return local_pseudo_labels(kind, self.model, self.data.X, self.y, self.params.n_classes,
                                       self.params.graph_params)
        unlabeled = self.y == UNLABELED
        if self.xclp is None or self.xclp.result is None:
            raise ProtocolError(f"the update of round {self.round} started before this party had its XCLP pseudo-labels")
        labels, confidence = self.xclp.predictions()
        return PseudoLabels(labels[unlabeled], confidence[unlabeled])

    def _push_update(self, step: pb.StepStart) -> None:
        assert self.self_masks is not None and self.round_masker is not None
        members = list(step.participants)
        if self.update is None:  # a restart sends the same update under fresh masks
            self.update = self._train()
        vector, rows = self.update
        local = fedavg.encode_update(vector, rows, self.params.frac_bits, len(members))
        masked = self.round_masker.apply(local, purpose=fedavg.UPDATE_PURPOSE, round=step.round, participants=members)
        sent = self.conn.push(self.self_masks.add(masked, step.round, members), sender=self.party_id, step=step.step,
                              round=step.round)
        self.progress(f"round {self.round}: {self._trained()}; masked update sent ({sent} bytes, "
                      f"{len(members)} parties)")

    def _train(self) -> tuple[np.ndarray, int]:
        """ClientUpdate from θ: (n_j·(θ_j − θ), n_j), recorded in `history`."""
        assert self.model is not None
        pseudo = self._pseudo_labels()  # XCLP's ran between the model and this step
        labeled_at = time.monotonic()
        update = client_update(self.model, training_set(self.data.X, self.y, pseudo), self.params.optimiser,
                               local_rng(self.seed, self.party_id, self.round))
        self.history.append(RoundRecord(self.round, self.model.flat.copy(), pseudo, update[1],
                                        labeled_at - self._round_started, time.monotonic() - labeled_at))
        return update

    def _trained(self) -> str:
        record = self.history[-1]
        return (f"pseudo-labels in {record.pseudo_seconds:.2f}s, trained on {record.rows} rows in "
                f"{record.train_seconds:.2f}s")

    def _final(self, payload: wire.Payload) -> None:
        self.result = self._model(payload, "the final model").flat
        self.progress(f"final model received ({self.arch.n_params} parameters)")

    # --- checks -----------------------------------------------------------------------------

    def _check_sample(self, t: int, members: Iterable[str]) -> None:
        outside = sorted(set(members) - self.sample)
        if outside:
            raise ProtocolError(f"round {t} names {', '.join(outside)}, outside the job's public sample of that "
                                "round: the coordinator may only drop parties from it, never choose others")

    def _model(self, payload: wire.Payload, what: str) -> Network:
        try:
            return Network(self.arch, fedavg.model_payload(payload, self.arch.n_params, what))  # type: ignore[arg-type]
        except InvalidInput as exc:
            raise ProtocolError(str(exc)) from None
