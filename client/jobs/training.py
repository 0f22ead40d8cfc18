"""Training rounds on the party's side (docs/design.md §7): the engine fedavg and dbcl share; its
counterpart is server/jobs/training.py.

Round t, in the round's scope ("r<t>.<name>", masks under the round's session id; the party's
context for it is `PartyContext.round_scope(t)`): "r<t>.model" brings the round's released model,
the trainer may run what the round needs before the update (fedavg with pseudo_label = "xclp":
one XCLP run), "r<t>.update" trains once from the model and pushes the update in the masked sum
(client/phases/masked_sum.py), "r<t>.update_reveal" opens it. "final_model" ends the job.

Before the first round, "samples": the party announces every round's sample, drawn from the
common seed the coordinator never sees (docs/design.md §2.6), and keeps it in its transcript.

What the party checks here, whatever the coordinator says (docs/design.md §2):
- every step of round t names only parties of its own sample of round t, so a coordinator
  cannot choose the sets it would difference; rounds only move forward, but a coordinator that
  restarted may run the current round again from its start with the same model, before this
  party revealed anything of it (its update sum then at a later attempt among no new party);
- one training per round: a restarted update sends the same update under fresh masks;
- one sum per model: once this party revealed its update for a model (θ; dbcl: the released
  view), it takes part in no later round on the same model with another set of parties (two
  sums over one model and different sets difference to the updates of the parties between);
- the model chain (fedavg, xclp.v1.training): every model released, in any round, and the final
  model must be the head of the chain: θ₀ as this party computes it, moved only by an opened sum
  this party recomputed or by a round's attestation from the head, signed by members of that
  round's sample, at least this party's min_parties of them. So no model a hair from one
  whose sum opened can be released after skipped rounds or rounds without this party;
- the masked-sum rules of docs/design.md §6.1 within each round.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from xclp.client.context import PartyContext, RelayedPhase
from xclp.client.jobs.base import PartyJob
from xclp.client.jobs.rounds_state import Chain, Round
from xclp.client.ledger import Release, function_id
from xclp.client.phases.masked_sum import MaskedSumParty, Noisy
from xclp.client.transcript import payload_digest
from xclp.crypto.identity import verify_signature
from xclp.errors import InvalidInput, ProtocolError
from xclp.fedavg import PseudoLabels
from xclp.privacy.dpsgd import DpPlan, RoundNoise
from xclp.v1 import registry, training, wire
from xclp.v1 import xclp_pb2 as pb
from xclp.v1.training import TrainingParams, private_training

if TYPE_CHECKING:
    pass

@dataclass(frozen=True)
class RoundRecord:
    """What this party saw of round t: the model as released to it (θ; dbcl: W̃ and b), its
    pseudo-labels (None: none), rows trained on, and seconds spent on pseudo-labels and on
    training; dbcl: the round's sketch seed."""

    round: int
    model_in: np.ndarray
    pseudo: PseudoLabels | None
    rows: int
    pseudo_seconds: float
    train_seconds: float
    seed: bytes = b""


class Trainer(Protocol):
    """What a training job does on the party's side in its rounds."""

    @property
    def params(self) -> TrainingParams: ...

    @property
    def verifiable(self) -> bool:
        """Whether the party sees the model, and so recomputes it from every sum it opens (docs/design.md §2.7)."""
        ...

    def open_round(self, scope: PartyContext, t: int, payload: wire.Payload) -> None:
        """Round t's released model arrived; `scope` is the party's context for the round."""

    def on_step(self, t: int, step: pb.StepStart) -> None:
        """A step of round t other than the update (named in the round's scope)."""

    def phases(self) -> Sequence[RelayedPhase]:
        """The current round's phases of the trainer's own that take messages (fedavg: its XCLP run's sums)."""
        ...

    def on_message(self, t: int, message: wire.Message) -> None:
        """A message of round t other than the model (named in the round's scope): from the
        coordinator, possibly before the round's model, or from a peer."""

    def train(self, t: int, started: float) -> tuple[np.ndarray, int, RoundRecord]:
        """Round t's update (the vector, the rows it came from) and what to record of the round;
        `started` is when the round's model arrived."""

    def describe(self, record: RoundRecord) -> str:
        """What the party's progress line says of a round's training."""
        ...

    def final(self, payload: wire.Payload) -> np.ndarray:
        """The job's last message, checked: the party's result."""

    def model_bytes(self) -> int:
        """The most bytes a released model (or view, or the final model) can take."""

    def update_size(self) -> int:
        """Values in this party's update before its row count."""

    def payload_limit(self, t: int, name: str, sender: str) -> int:
        """What another message of round t can need (named in the round's scope); ProtocolError
        for one the trainer never gets."""

    def next_model(self, total: np.ndarray) -> np.ndarray | None:
        """The model after this round, moved by the opened update sum (None: the party cannot know
        it, as in DBCL, where it never sees W)."""

    def initial_model(self) -> np.ndarray | None:
        """θ₀ as this party computes it from the job's parameters: the head of the model chain
        (None where the party never sees the model)."""

    def state(self) -> dict[str, Any] | None:
        """What a restarted process needs of the trainer beyond the round's model (DBCL: the rounds'
        seeds), as JSON; None where the round cannot be rejoined (one that runs XCLP)."""

    def restore(self, state: dict[str, Any]) -> None:
        """`state` back, before the round is opened again."""


class RoundsParty(PartyJob):
    def __init__(self, ctx: PartyContext, trainer: Trainer) -> None:
        super().__init__(ctx)
        self.trainer = trainer
        self.params = trainer.params
        self.round = -1  # the last round this party entered (its sum may have opened: no live round)
        self.live: Round | None = None  # the round it is in (client/jobs/rounds_state.py)
        self.samples: tuple[tuple[str, ...], ...] | None = None  # every round's sample, from the common seed
        self.released: dict[bytes, tuple[int, frozenset[str]]] = {}  # model digest -> (round, set) revealed for
        initial = trainer.initial_model() if trainer.verifiable else None
        self.chain = Chain(None if initial is None else training.model_digest(initial))
        self.history: list[RoundRecord] = []
        # record-level DP (xclp.privacy.dpsgd): the job's noise, and this round's share of it
        self.dp: DpPlan | None = private_training(self.params).dp_plan(trainer.update_size())
        if self.dp is not None and self.ctx.account is not None:  # the ledger composes runs by RDP
            self.ctx.account.mechanism("release", self.dp.rdp)

    @property
    def update_sum(self) -> MaskedSumParty | None:
        return None if self.live is None else self.live.update_sum

    @property
    def update(self) -> tuple[np.ndarray, int] | None:
        return None if self.live is None else self.live.update

    def privacy(self) -> dict[str, Any] | None:
        if self.dp is None:
            return None
        spent = private_training(self.params).epsilon_spent(self.trainer.update_size(), len(self.history))
        return {"epsilon_spent": spent, "epsilon_budget": self.dp.epsilon,
                "delta": self.dp.delta, "rounds": len(self.history), "noise_multiplier": self.dp.noise_multiplier,
                "clip_norm": self.dp.clip, "distributed": self.dp.distributed}

    def rounds(self) -> tuple[RoundRecord, ...]:
        return tuple(self.history)

    def phases(self) -> tuple[RelayedPhase, ...]:
        """The current round's update sum and the trainer's phases of the round."""
        return (*(() if self.live is None else (self.live.update_sum,)), *self.trainer.phases())

    def on_message(self, message: wire.Message) -> None:
        if message.sender == "" and message.step == training.FINAL_MSG:
            self._check_chain(message.payload, "the final model")
            self.result = self.trainer.final(message.payload)
            privacy = self.privacy()
            if privacy is not None:
                self.ctx.progress(f"privacy spent by this party's rows: ε = {privacy['epsilon_spent']:.3g} of the "
                                  f"job's {privacy['epsilon_budget']:g} (δ = {privacy['delta']:g}) over "
                                  f"{privacy['rounds']} round(s)")
            return
        scope = training.unscope(message.step)
        if scope is None:
            raise ProtocolError(f"{message.sender or 'the coordinator'!r} sent an unknown {message.step!r} message")
        t, name = scope
        if message.sender != "" and t < self.round:
            return  # a relay of an earlier round, which this party has left
        if message.sender == "" and name == training.MODEL_MSG:
            self._start_round(t, message.payload)
        elif message.sender == "" and name == training.ATTESTED_MSG:
            self._on_attested(t, message.payload)
        else:
            self.trainer.on_message(t, dataclasses.replace(message, step=name))

    def payload_limit(self, step: str, sender: str) -> int:
        scope = training.unscope(step)
        if sender == "" and (step == training.FINAL_MSG or (scope is not None and scope[1] == training.MODEL_MSG)):
            return self.trainer.model_bytes()
        if sender == "" and scope is not None and scope[1] == training.ATTESTED_MSG:
            return training.Attested.limit(len(self.ctx.roster.party_ids))
        if scope is None:
            raise ProtocolError(f"{sender or 'the coordinator'!r} sent an unknown {step!r} message")
        return self.trainer.payload_limit(*scope, sender)

    def on_step(self, step: pb.StepStart) -> None:
        if step.step == training.SAMPLES_STEP:
            self._announce_samples(step)
            return
        scope = training.unscope(step.step)
        if scope is None:
            raise ProtocolError(f"unknown step {step.step!r} for a training job")
        t, name = scope
        live = self.live
        if t != self.round or live is None:
            raise ProtocolError(f"step {step.step!r} started, but this party is in round {self.round}")
        self._check_sample(t, step.participants)
        if name == training.ATTEST_STEP:
            self._attest(t, step.round)
            return
        local = pb.StepStart(step=name, round=step.round, participants=step.participants,
                             deadline_seconds=step.deadline_seconds)
        if not live.update_sum.handles(name):
            self.trainer.on_step(t, local)
            return
        if name == training.UPDATE_STEP:
            self._check_model_reuse(live, frozenset(step.participants))
        sent = live.update_sum.on_step(local)
        if name == live.update_sum.reveal_name:
            self.released.setdefault(live.model_digest, (t, frozenset(step.participants)))
            self.ctx.checkpoint()  # revealed: a restarted process never masks this round again
        if name == training.UPDATE_STEP:
            record = self.history[-1]
            self.ctx.progress(f"round {t}: {self.trainer.describe(record)}; masked update sent ({sent} bytes, "
                              f"{len(step.participants)} parties)")

    def _start_round(self, t: int, payload: wire.Payload) -> None:
        if t == self.round and self.live is not None:
            self._round_again(self.live, payload)
            return
        if t <= self.round:
            raise ProtocolError(f"round {t} started after round {self.round}: rounds only move forward")
        if t >= self.params.rounds:
            raise ProtocolError(f"round {t} started, but the job has {self.params.rounds} rounds")
        if self.samples is None:
            raise ProtocolError(f"round {t} started before the parties announced the rounds' samples")
        self._open_round(t, payload)
        self.ctx.progress(f"round {t}: model received")
        self.ctx.checkpoint()  # what a restarted process rejoins the round with (client/run_state.py)

    def _open_round(self, t: int, payload: wire.Payload) -> Round:
        """Round t, new, from its model: the round it replaces is left whole."""
        sample = frozenset(self.samples[t])  # type: ignore[index]
        if self.ctx.party_id not in sample:
            raise ProtocolError(f"round {t} names {self.ctx.party_id}, outside the sample the parties drew for that "
                                "round: the coordinator may only drop parties from it, never choose others")
        scope = self.ctx.round_scope(t)
        self._check_chain(payload, f"the model of round {t}")
        # θ, or DBCL's released view: one for every party (docs/design.md §2.5)
        digest = scope.transcript.absorb("model", payload)
        model_in = payload if self.trainer.verifiable and isinstance(payload, np.ndarray) else None
        update_sum = MaskedSumParty(scope, training.UPDATE_STEP, self._update, purpose=training.UPDATE_PURPOSE,
                                    on_opened=None if model_in is None else self._opened,
                                    releases=Noisy.DP if self.dp is not None else self._releases)
        self.round, self.live = t, Round(t, sample, digest, payload, model_in, update_sum, time.monotonic())
        self.trainer.open_round(scope, t, payload)
        return self.live

    def _round_again(self, live: Round, payload: wire.Payload) -> None:
        """A restarted coordinator runs this round again from its start (server/resume.py): the same
        model, before this party revealed anything of the round's sum; its update sum then goes on at
        a later attempt, where this party masks the same update (noise included) under fresh masks."""
        t = live.t
        if live.update_sum.self_masks.revealed:
            raise ProtocolError(f"round {t} started again after this party revealed its update sum: the round's sum "
                                "is opened once; refusing to mask its update again")
        if payload_digest(payload) != live.model_digest:
            raise ProtocolError(f"round {t} started again with another model than the one released for it")
        self.ctx.progress(f"round {t}: started again by the coordinator; the same model"
                          + (", and the same update under fresh masks" if live.update is not None else ""))

    def _opened(self, total: np.ndarray, attempt: int, members: tuple[str, ...]) -> None:
        """The round's update sum, recomputed here from every masked vector and seed."""
        try:
            model = self.trainer.next_model(total)
        except InvalidInput as exc:
            raise ProtocolError(f"round {self.round}'s opened update sum is unusable: {exc}") from None
        live = self.live
        if model is not None and live is not None and live.model_in is not None:
            before, after = training.model_digest(live.model_in), training.model_digest(model)
            self.chain = Chain(after, live.t, (live.t, before, after))
            self.ctx.checkpoint()  # the chain's new head, which the next round's model must be

    def _check_chain(self, payload: wire.Payload, what: str) -> None:
        """A released model (any round's, or the final one) must be the head of the model chain."""
        if self.chain.head is None:  # the party never sees the model (dbcl)
            return
        if not isinstance(payload, np.ndarray) or training.model_digest(payload) != self.chain.head:
            since = ("θ₀ as this party computes it from the job's parameters" if self.chain.round < 0 else
                     f"the model round {self.chain.round}'s opened sum led to")
            raise ProtocolError(f"{what} is not the head of the model chain ({since}; a round whose sum did not come "
                                "back leaves it there): a model near one whose sum was opened would let the "
                                "coordinator difference two sums; refusing it")

    def _attest(self, t: int, attempt: int) -> None:
        """Round t's link θ_t → θ_{t+1}, as this party recomputed it from the opened sum, signed."""
        link = self.chain.link
        if link is None or link[0] != t:
            raise ProtocolError(f"the coordinator asked this party to attest round {t}'s model, which it did not "
                                "recompute from an opened sum")
        _, before, after = link
        signature = self.ctx.sign(training.chain_message(self.ctx.session_id, t, before, after))
        self.ctx.push(training.Attestation(before, after, signature).pack(), training.scoped(t, training.ATTEST_STEP),
                      attempt)

    def _on_attested(self, t: int, payload: wire.Payload) -> None:
        """Round t's link of the chain, signed by members of its sample: the head moves along it."""
        what = f"the attestation of round {t}'s model"
        if self.chain.head is None or self.samples is None or not 0 <= t < self.params.rounds:
            raise ProtocolError(f"the coordinator sent {what}, which this party does not expect")
        try:
            attested = training.Attested.unpack(payload, self.ctx.roster.party_ids)
        except InvalidInput as exc:
            raise ProtocolError(f"{what}: {exc}") from None
        outside = sorted(set(attested.signatures) - set(self.samples[t]))
        if outside:
            raise ProtocolError(f"{what} is signed by {', '.join(outside)}, outside that round's sample")
        message = training.chain_message(self.ctx.session_id, t, attested.before, attested.after)
        for p, signature in attested.signatures.items():
            if not verify_signature(self.ctx.roster.bundle(p).identity_public, signature, message):
                raise ProtocolError(f"{what}: the signature of {p!r} does not verify under its identity key")
        if attested.after == self.chain.head:
            return  # this party recomputed that link itself
        if attested.before != self.chain.head:
            raise ProtocolError(f"{what} starts from another model than the head of this party's model chain")
        if len(attested.signatures) < self.ctx.min_parties:
            # one colluding member of the sample could otherwise move every head the round passed by; a
            # link signed by this party's minimum has an honest signer, who signs only what it recomputed
            raise ProtocolError(
                f"{what} is signed by {', '.join(sorted(attested.signatures))} only, of that round's sample "
                f"({', '.join(self.samples[t])}): this party follows a link only when at least its minimum of "
                f"{self.ctx.min_parties} members signed it (--min-parties); its model chain stays where it is")
        self.chain = Chain(attested.after, t)
        self.ctx.checkpoint()

    # --- a restart (client/run_state.py; the values in client/jobs/rounds_state.py) ---------------

    def saved(self) -> tuple[dict[str, Any], dict[str, np.ndarray]] | None:
        """This party's state from the rounds' samples on; None before them, or in a round the trainer
        cannot rejoin until the party has its update (one that runs XCLP: its pseudo-labels are not
        kept)."""
        state = self.trainer.state()
        if state is None and self.update is not None:  # the update is all the round needs from here on
            state = {}
        if self.samples is None or state is None:
            return None
        live, arrays = ({"revealed": None, "rows": None, "round_transcript": None, "noise_variance": None}, {}) \
            if self.live is None else self.live.saved()
        meta = {"round": self.round, "samples": [list(s) for s in self.samples], "trainer": state,
                **self.chain.saved(), **live,
                "released": {d.hex(): [t, sorted(m)] for d, (t, m) in self.released.items()},
                "history": [{"round": r.round, "rows": r.rows, "pseudo_seconds": r.pseudo_seconds,
                             "train_seconds": r.train_seconds, "seed": r.seed.hex()} for r in self.history]}
        return meta, arrays

    @classmethod
    def restored(cls, ctx: PartyContext, meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> RoundsParty:
        """The party as `saved` described it: in its round again, waiting for the coordinator to
        start the round's sum again with it (it sends the round's model again, which must be this
        one); or, if the round's sum was opened here, waiting for the next round."""
        job = cls(ctx)  # type: ignore[call-arg]
        job.trainer.restore(meta["trainer"])
        job.samples = tuple(tuple(s) for s in meta["samples"])
        job.released = {bytes.fromhex(d): (int(t), frozenset(m)) for d, (t, m) in meta["released"].items()}
        job.history = [RoundRecord(h["round"], np.zeros(0), None, h["rows"], h["pseudo_seconds"], h["train_seconds"],
                                   bytes.fromhex(h["seed"])) for h in meta["history"]]
        job.chain = Chain.from_saved(meta)
        t = int(meta["round"])
        if t >= 0 and job.chain.round < t:  # the round's sum was not opened here: the round again, as it was
            job._open_round(t, arrays["model"]).restore(meta, arrays, job.dp)
        job.round = t
        return job

    def _check_model_reuse(self, live: Round, members: frozenset[str]) -> None:
        t, earlier = live.t, self.released.get(live.model_digest)
        if earlier is not None and earlier[1] != members:
            s, before = earlier
            raise ProtocolError(f"round {t} releases the model of round {s}, whose update sum this party opened among "
                                f"{', '.join(sorted(before))}; a second sum over it among {', '.join(sorted(members))} "
                                "would give away the difference: this party stops")

    def _announce_samples(self, step: pb.StepStart) -> None:
        if self.samples is not None or self.round >= 0:
            raise ProtocolError("the samples step started twice, or after the first round")
        roster = self.ctx.roster.party_ids
        payload = training.samples_payload(self.ctx.seed, self.params.rounds, roster, self.params.fraction)
        self.ctx.transcript.absorb(training.SAMPLES_STEP, payload)  # every round's transcript starts from it
        self.samples = training.samples_from_payload(payload, self.params.rounds, roster)
        self.ctx.push(payload, training.SAMPLES_STEP, step.round)

    def _releases(self, members: tuple[str, ...]) -> list[Release]:
        """An exact update, of every round: the ledger keeps the data set's exact releases among one
        set of parties, so no descriptor of "which update" (the model, the settings) is trusted to
        tell two updates apart (a full batch is the same update at any larger batch size, an update
        is linear in the learning rate, a chain can be replayed). DBCL's views are the coordinator's
        to choose; DBCL without DP is the party's own risk (--allow-non-dp-dbcl)."""
        return [Release(function_id("update", registry.of(self.ctx.params).name), "training updates")]

    def _update(self, members: tuple[str, ...]) -> np.ndarray:
        live = self.live
        assert live is not None  # the update sum asks for it only in its round
        fresh = live.update is None
        if live.update is None:  # a restart sends the same update under fresh masks
            vector, rows, record = self.trainer.train(live.t, live.started)
            live.update = (vector, rows)
            self.history.append(record)
        vector, rows = live.update
        # the round's noise share (distributed DP), topped up if the sum restarted with fewer parties
        if self.dp is not None and self.dp.distributed:
            if live.noise is None:
                live.noise = RoundNoise(self.dp, vector.shape[0])
            vector = vector + live.noise.for_members(len(members))
        if fresh or self.dp is not None:  # the update and its noise, before any of it is masked
            self.ctx.checkpoint()
        if self.dp is None:
            return training.encode_update(vector, rows, self.params.frac_bits, len(members))
        return training.encode_private_update(vector, rows)

    def _check_sample(self, t: int, members: Iterable[str]) -> None:
        outside = sorted(set(members) - (frozenset() if self.live is None else self.live.sample))
        if outside:
            raise ProtocolError(f"round {t} names {', '.join(outside)}, outside the sample the parties drew for that "
                                "round: the coordinator may only drop parties from it, never choose others")
