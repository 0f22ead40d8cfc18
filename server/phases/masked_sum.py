"""The one masked sum of the coordinator (docs/design.md §6.1); every job's sums are this phase.

Attempt a of the sum among participants P_a:

    step <name>          every p in P_a pushes y_p = x_p + PRG(b_p) + Σ ±PRG(k_pq) (dtype, shape: `wire`)
    step <name>_confirm  once every y_p is in: the same attempt among the holders P_a; each answers
                         T_p ‖ C_p ‖ Sig_p(session, step, a, P_a, T_p, C_p), its transcript hash and
                         its commitment to b_p signed; the coordinator relays all of them to every
                         member
    step <name>_reveal   the same attempt among the same holders; each party reveals only if every
                         member signed its T; each answers digest(session, step, a, P_a) ‖ b_p
    opened               {p: y_p − PRG(b_p)}, whose pairwise masks cancel in any sum over P_a
                         (every b_p, revealed or rebuilt, must open C_p);
                         `combine` makes the result of them (the ring sum by default)

A verifiable sum (FedAvg, docs/design.md §2.7) also sends every member all masked vectors (message
<name>_vectors, before the confirm step: they are in what the members confirm) and, once opened,
all self-mask seeds (<name>_seeds): every member recomputes the sum, and the model from it.

With its masked vector each party sends every other member a sealed Shamir share of its seed
(relayed unread, xclp.v1.double_masking). A participant lost during the masked or the confirm
step: its partners' masks no longer cancel (nobody has revealed anything), so the step restarts as
attempt a + 1 among the rest, under fresh keys; the rest must be at least the scope's minimum, and
each party's own guard refuses a set that does not strictly shrink. Holders M lost while revealing:

    step <name>_recover  the same attempt among the holders R that revealed (|R| ≥ t); each answers
                         recover_digest(session, step, a, P_a, R) ‖ its share of every b_j, j ∈ M;
                         b_j = Shamir combine of the shares, and the sum opens over all of P_a

Too few holders left (fewer than t, or a sum of two) fails the phase (a training round skips it;
other jobs fail). The coordinator so opens at most one attempt of a sum, and only one whose every
contribution it held; the ledger records whose seed was rebuilt. It confirms, reveals and recovers
only the latest attempt it started (xclp.v1.double_masking.dead_attempt, the rule the parties keep).
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from xclp.crypto import shamir
from xclp.crypto.masking import ring_sum
from xclp.errors import InvalidInput
from xclp.server.phases.base import Phase, Scope, Step
from xclp.v1 import wire
from xclp.v1.double_masking import (
    CONFIRM_BYTES,
    SEALED_SHARE_BYTES,
    Confirmation,
    commit_seed,
    confirm_step,
    dead_attempt,
    recover_digest,
    recover_step,
    recoverable,
    recovery_bytes,
    reveal_digest,
    reveal_step,
    seeds_message,
    self_mask,
    share_index,
    share_threshold,
    unpack_recovery,
    unpack_reveal,
    vectors_message,
)

log = logging.getLogger("xclp.server")

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

    relays = True  # the masked step carries every member's sealed self-mask shares

    def __init__(self, scope: Scope, name: str, *, wire: WireSpec | tuple[np.dtype[Any], tuple[int, ...]],
                 what: str = "array", participants: Sequence[str] | None = None, combine: Combine = ring_total,
                 digest_name: str | None = None, verifiable: bool = False, first_attempt: int = 0,
                 rejoinable: bool = False) -> None:
        super().__init__(scope)
        # a member whose process restarted may rejoin it: it masks the same value again (its run
        # state keeps it), and the sum starts its next attempt among the same parties
        self.rejoinable = rejoinable
        self.first_attempt = first_attempt  # past any the parties saw, when a restarted coordinator goes on
        self.name = name
        self.confirm = confirm_step(name)
        self.reveal = reveal_step(name)
        self.recover = recover_step(name)
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
        self.seeds: dict[str, bytes] = {}  # the revealed (or rebuilt) self-mask seeds of that attempt
        self.commitments: dict[str, bytes] = {}  # each holder's signed commitment to its seed of that attempt
        self.latest: int | None = None  # the latest attempt whose every masked vector came in: the only live one
        self.configured_threshold = scope.run.config.params.share_threshold

    def start(self) -> None:
        self.scope.start_step(self.name, self.participants, self.first_attempt)

    @property
    def opening(self) -> bool:
        """Whether the holders have been asked to reveal: past that, no restart of the sum is possible
        (a party that revealed takes part in no later attempt), so no checkpoint may hold it."""
        return self.commitments != {} or bool(self.seeds)

    def on_restarted(self, step: Step, party: str) -> bool:
        """A rejoinable sum starts its next attempt with the restarted party, until the holders are
        asked to reveal: then no attempt follows, and the run drops it as after any lost connection."""
        if not self.rejoinable or self.opening or step.name not in (self.name, self.confirm):
            return False
        self.resend(party)
        self.scope.start_step(self.name, step.participants, step.attempt + 1)
        return True

    def resend(self, party: str) -> None:
        """What the restarted `party` needs again before the next attempt (a round's model)."""

    def _committed(self, party: str, seed: bytes, attempt: int) -> bool:
        expected = self.commitments.get(party)
        return expected is not None and hmac.compare_digest(
            commit_seed(self.scope.session_id, self.digest_name, attempt, party, seed), expected)

    def threshold(self, holders: tuple[str, ...]) -> int:
        return share_threshold(self.configured_threshold, len(holders))

    def payload_limit(self, sender: str, step: Step, recipient: str) -> int:
        if step.name == self.name:
            return SEALED_SHARE_BYTES if recipient else wire.array_bytes(*self.wire(sender, step.participants))
        if step.name == self.confirm:
            return CONFIRM_BYTES
        if step.name == self.recover:
            assert self.masked is not None
            return recovery_bytes(len(self.masked.participants) - len(step.participants))
        return super().payload_limit(sender, step, recipient)

    def check_relay(self, step: Step, sender: str, recipient: str, payload: wire.Payload) -> None:
        """Only the masked step carries peer messages: one sealed share of the sender's seed each."""
        if step.name != self.name or not recoverable(self.threshold(step.participants), len(step.participants)):
            raise InvalidInput(f"step {step.wire!r} attempt {step.attempt} carries no peer-to-peer messages")
        if not isinstance(payload, bytes) or len(payload) != SEALED_SHARE_BYTES:
            raise InvalidInput(f"a sealed self-mask share is {SEALED_SHARE_BYTES} opaque bytes")

    def accept(self, step: Step, sender: str, payload: wire.Payload) -> None:
        if step.name == self.recover:
            assert self.masked is not None
            holders = self.masked.participants
            digest, _ = unpack_recovery(payload, len(holders) - len(step.participants))
            expected = recover_digest(self.scope.session_id, self.digest_name, step.attempt, holders, step.participants)
            if not hmac.compare_digest(digest, expected):
                raise InvalidInput(f"the recovery shares of {sender!r} are for another session, attempt or set")
            return
        if step.name == self.name:
            ring_array(payload, *self.wire(sender, step.participants), f"the masked {self.what} from {sender!r}")
            return
        if step.name == self.confirm:
            Confirmation.unpack(payload)
            return
        digest, seed = unpack_reveal(payload)
        expected = reveal_digest(self.scope.session_id, self.digest_name, step.attempt, step.participants)
        if not hmac.compare_digest(digest, expected):
            raise InvalidInput(f"the self-mask reveal of {sender!r} is for another session, attempt or participant set")
        if not self._committed(sender, seed, step.attempt):
            raise InvalidInput(f"the self-mask seed of {sender!r} does not open the commitment it signed")

    def on_step_complete(self, step: Step) -> None:
        if step.name != self.name and dead_attempt(step.attempt, self.latest) is not None:
            # never: the phase asks for the latest attempt only
            self.fail(f"step {step.wire!r} attempt {step.attempt} completed, but the sum's live attempt is "
                      f"{self.latest}: an attempt left is never opened")
            return
        if step.name == self.name:
            self.latest = step.attempt if self.latest is None else max(self.latest, step.attempt)
            self.masked = step  # every contribution is here: the holders confirm what they saw
            if self.verifiable:
                vectors = np.stack([np.asarray(step.received[p]) for p in step.participants])
                for p in step.participants:
                    self.scope.send(p, vectors_message(self.name), step.attempt, vectors)
            self.scope.start_step(self.confirm, step.participants, step.attempt)
            return
        if step.name == self.confirm:  # every member gets every confirmation, then reveals or refuses
            relayed = b"".join(_opaque(step.received[p]) for p in step.participants)
            self.commitments = {p: Confirmation.unpack(step.received[p]).commitment for p in step.participants}
            for p in step.participants:
                self.scope.send(p, self.confirm, step.attempt, relayed)
            self.run.checkpoint_stale()  # a restarted coordinator must never ask again for what is revealed now
            self.scope.start_step(self.reveal, step.participants, step.attempt)
            return
        if step.name == self.reveal:
            self.seeds.update({p: unpack_reveal(step.received[p])[1] for p in step.received})
            missing = [p for p in step.participants if p not in self.seeds]
            if missing:
                self._start_recovery(step, missing)
            else:
                self._open()
            return
        self._rebuild(step)

    def on_dropped(self, step: Step, dropped: set[str]) -> None:
        if step.name in (self.reveal, self.recover):
            # every contribution is held: the sum still opens if enough holders can rebuild the lost seeds
            step.pending -= dropped
            assert self.masked is not None
            lost = [p for p in self.masked.participants if p not in self.seeds and p not in step.received
                    and p not in step.pending]
            left = len(self._givers(step) | step.pending)
            if lost and left < self.threshold(self.masked.participants):
                self._cannot_rebuild(lost, left)
            else:
                self.complete_if_done(step)
            return
        rest = [p for p in step.participants if p not in dropped and p in self.scope.members]  # masked or confirm
        if len(rest) < self.scope.min_members:
            self.fail(f"only {len(rest)} parties are left for the {self.name!r} sum")
            return
        self.scope.start_step(self.name, rest, step.attempt + 1)  # fresh masks among the rest

    def _givers(self, step: Step) -> set[str]:
        """Those who answered `step` (a reveal or recover step) and are still in the scope."""
        return {p for p in step.received if p in self.scope.members}

    def _cannot_rebuild(self, lost: list[str], left: int) -> None:
        assert self.masked is not None
        holders = self.masked.participants
        t = self.threshold(holders)
        why = ("a sum of two cannot rebuild a lost seed" if len(holders) < 3 else
               f"{len(holders)} parties share a seed t = {t} of n, and only {left} holders are left")
        self.fail(f"{', '.join(lost)} left while the {self.name!r} sum was opened, and it cannot be: {why} "
                  "(docs/design.md §6.1)")

    def _start_recovery(self, reveal: Step, missing: list[str]) -> None:
        """Holders `missing` revealed nothing: those that did give their shares of the lost seeds."""
        givers = sorted(self._givers(reveal))
        t = self.threshold(reveal.participants)
        if not recoverable(t, len(reveal.participants)) or len(givers) < t:
            self._cannot_rebuild(missing, len(givers))
            return
        log.warning("job %s: %s lost while revealing in %s attempt %d: rebuilding the self-mask seed from %d "
                    "holders' shares (t = %d)", self.run.config.job_id, ", ".join(missing), reveal.wire,
                    reveal.attempt, len(givers), t)
        self.scope.start_step(self.recover, givers, reveal.attempt)

    def _rebuild(self, step: Step) -> None:
        """b_j of every lost holder j from the givers' shares, then the sum."""
        assert self.masked is not None
        holders = self.masked.participants
        outside = [p for p in holders if p not in step.participants]  # each giver's answer covers these, sorted
        answers = {p: unpack_recovery(step.received[p], len(outside))[1] for p in step.received}
        t = self.threshold(holders)
        for i, lost in enumerate(outside):
            if lost in self.seeds:  # revealed, then left the scope
                continue
            shares = {share_index(p, holders): answer[i] for p, answer in answers.items()}
            try:
                seed = shamir.combine(shares, t)
            except InvalidInput as exc:
                self.fail(f"the self-mask seed of {lost!r} in the {self.name!r} sum cannot be rebuilt: {exc}")
                return
            if not self._committed(lost, seed, step.attempt):
                self.fail(f"the self-mask seed of {lost!r} in the {self.name!r} sum rebuilt from {len(shares)} shares "
                          "does not open its commitment: a holder gave a wrong share")
                return
            self.seeds[lost] = seed
            self.run.ledger[self.name].recovered.append(f"{lost} in {self.scope.wire(self.name)}")  # from shares
            log.warning("job %s: %s: reconstructed b for party %s from %d shares", self.run.config.job_id,
                        self.scope.wire(self.name), lost, len(shares))
        self._open()

    def _open(self) -> None:
        """Every seed of the complete attempt is here: subtract the self masks and combine."""
        assert self.masked is not None
        step = self.masked
        opened = {}
        for p in step.participants:
            masked = np.asarray(step.received[p])
            opened[p] = masked - self_mask(self.seeds[p], masked.shape, masked.dtype)
        if self.verifiable:
            seeds = b"".join(self.seeds[p] for p in step.participants)
            for p in step.participants:
                if p in self.scope.members:
                    self.scope.send(p, seeds_message(self.name), step.attempt, seeds)
        self.done(SumResult(self.combine(opened, step.participants), step.attempt, step.participants))


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
