"""The one masked sum of the coordinator (DESIGN §6.1); every job's sums are this phase.

Attempt a of the sum among participants P_a:

    step <name>          every p in P_a pushes y_p = x_p + PRG(b_p) + Σ ±PRG(k_pq) (dtype, shape: `wire`)
    step <name>_confirm  once every y_p is in: the same attempt among the holders P_a; each answers
                         T_p ‖ Sig_p(session, step, a, P_a, T_p), its transcript hash signed
                         (DESIGN §2.5); the coordinator relays all of them to every member
    step <name>_reveal   the same attempt among the same holders; each party reveals only if every
                         member signed its T; each answers digest(session, step, a, P_a) ‖ b_p
    opened               {p: y_p − PRG(b_p)}, whose pairwise masks cancel in any sum over P_a;
                         `combine` makes the result of them (the ring sum by default)

A verifiable sum (FedAvg, DESIGN §2.7) also sends every member all masked vectors (message
<name>_vectors, before the confirm step: they are in what the members confirm) and, once opened,
all self-mask seeds (<name>_seeds): every member recomputes the sum, and the model from it.

A participant lost during the masked or the confirm step: its partners' masks no longer cancel
(nobody has revealed anything), so the step
restarts as attempt a + 1 among the rest, under fresh keys; the rest must be at least the scope's
minimum, and each party's own guard refuses a set that does not strictly shrink. A participant lost
while revealing fails the phase: the others revealed their seeds and mask no other attempt, so the
sum is lost (a training round skips it; other jobs fail). The coordinator so opens at most one
attempt of a sum, and only one whose every contribution it held.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from xclp.crypto.masking import ring_sum
from xclp.errors import InvalidInput
from xclp.server.phases.base import Phase, Scope, Step
from xclp.v1 import wire
from xclp.v1.double_masking import (
    CONFIRM_BYTES,
    SEEDS_SUFFIX,
    VECTORS_SUFFIX,
    confirm_step,
    reveal_digest,
    reveal_step,
    self_mask,
    unpack_reveal,
)

# (sender, participants) -> the dtype and shape of the sender's masked array
WireSpec = Callable[[str, tuple[str, ...]], tuple[np.dtype[Any], tuple[int, ...]]]
Combine = Callable[[Mapping[str, np.ndarray], tuple[str, ...]], Any]


@dataclass(frozen=True)
class SumResult:
    """The opened sum: `value` as `combine` made it, and the attempt and participants it is over."""

    value: Any
    attempt: int
    participants: tuple[str, ...]


def ring_total(opened: Mapping[str, np.ndarray], participants: tuple[str, ...]) -> np.ndarray:
    """The default combine: the ring sum of every opened contribution."""
    return ring_sum(opened[p] for p in participants)


class MaskedSum(Phase):
    """A double-masked sum named `name` among `participants` (default: the scope's members)."""

    def __init__(self, scope: Scope, name: str, *, wire: WireSpec | tuple[np.dtype[Any], tuple[int, ...]],
                 what: str = "array", participants: Sequence[str] | None = None, combine: Combine = ring_total,
                 digest_name: str | None = None, verifiable: bool = False) -> None:
        super().__init__(scope)
        self.name = name
        self.confirm = confirm_step(name)
        self.reveal = reveal_step(name)
        self.wire: WireSpec = wire if callable(wire) else _fixed(wire)
        self.what = what
        self.participants = tuple(sorted(scope.members if participants is None else participants))
        self.combine = combine
        # The step name the reveal digest binds: the wire name unless the phase names another
        # (XCLP's row sums bind "rowsums" in every scope, as parties have since v0.1; in a training
        # round the session id is the round's, so the round is bound either way).
        self.digest_name = scope.wire(name) if digest_name is None else digest_name
        self.masked: Step | None = None  # the complete attempt whose self masks are being revealed
        self.verifiable = verifiable

    def start(self) -> None:
        self.scope.start_step(self.name, self.participants, 0)

    def payload_limit(self, sender: str, step: Step, recipient: str) -> int:
        if step.name == self.name:
            return wire.array_bytes(*self.wire(sender, step.participants))
        if step.name == self.confirm:
            return CONFIRM_BYTES
        return super().payload_limit(sender, step, recipient)

    def accept(self, step: Step, sender: str, payload: wire.Payload) -> None:
        if step.name == self.name:
            ring_array(payload, *self.wire(sender, step.participants), f"the masked {self.what} from {sender!r}")
            return
        if step.name == self.confirm:
            if not isinstance(payload, bytes) or len(payload) != CONFIRM_BYTES:
                raise InvalidInput(f"a confirmation of the {self.name!r} sum is {CONFIRM_BYTES} opaque bytes")
            return
        digest, _ = unpack_reveal(payload)
        expected = reveal_digest(self.scope.session_id, self.digest_name, step.attempt, step.participants)
        if not hmac.compare_digest(digest, expected):
            raise InvalidInput(f"the self-mask reveal of {sender!r} is for another session, attempt or participant set")

    def on_step_complete(self, step: Step) -> None:
        if step.name == self.name:
            self.masked = step  # every contribution is here: the holders confirm what they saw
            if self.verifiable:
                vectors = np.stack([np.asarray(step.received[p]) for p in step.participants])
                for p in step.participants:
                    self.scope.send(p, self.name + VECTORS_SUFFIX, step.attempt, vectors)
            self.scope.start_step(self.confirm, step.participants, step.attempt)
            return
        if step.name == self.confirm:  # every member gets every confirmation, then reveals or refuses
            relayed = b"".join(_opaque(step.received[p]) for p in step.participants)
            for p in step.participants:
                self.scope.send(p, self.confirm, step.attempt, relayed)
            self.scope.start_step(self.reveal, step.participants, step.attempt)
            return
        assert self.masked is not None
        opened = {}
        for p in step.participants:
            masked = np.asarray(self.masked.received[p])
            opened[p] = masked - self_mask(unpack_reveal(step.received[p])[1], masked.shape, masked.dtype)
        if self.verifiable:
            seeds = b"".join(unpack_reveal(step.received[p])[1] for p in step.participants)
            for p in step.participants:
                self.scope.send(p, self.name + SEEDS_SUFFIX, step.attempt, seeds)
        self.done(SumResult(self.combine(opened, step.participants), step.attempt, step.participants))

    def on_dropped(self, step: Step, dropped: set[str]) -> None:
        if step.name == self.reveal:
            self.fail(f"{', '.join(sorted(dropped))} left while revealing self masks, so the {self.name!r} sum "
                      "cannot be opened (DESIGN §6.1)")
            return
        rest = [p for p in step.participants if p not in dropped and p in self.scope.members]  # masked or confirm
        if len(rest) < self.scope.min_members:
            self.fail(f"only {len(rest)} parties are left for the {self.name!r} sum")
            return
        self.scope.start_step(self.name, rest, step.attempt + 1)  # fresh masks among the rest


def _opaque(payload: wire.Payload) -> bytes:
    assert isinstance(payload, bytes)  # accept() let nothing else in
    return payload


def _fixed(spec: tuple[np.dtype[Any], tuple[int, ...]]) -> WireSpec:
    """The same dtype and shape for every sender and participant set."""
    return lambda sender, participants: spec


def ring_array(payload: wire.Payload, dtype: np.dtype[Any], shape: tuple[int, ...], what: str) -> np.ndarray:
    """The payload as an array of exactly `dtype`/`shape`, or InvalidInput naming what differs."""
    if not isinstance(payload, np.ndarray):
        raise InvalidInput(f"{what} must be an array, got opaque bytes")
    if payload.dtype != dtype or payload.shape != shape:
        raise InvalidInput(f"{what} must be {dtype.str}{list(shape)}, got {payload.dtype.str}{list(payload.shape)}")
    return payload
