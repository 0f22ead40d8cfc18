"""The one masked sum of the party (docs/design.md §6.1); its counterpart is server/phases/masked_sum.py.

Attempt a among participants P_a (the coordinator's StepStart names both):
- step <name>: push x + Σ_{q∈P_a, q≠me} ±PRG(k_q) + PRG(b_a) in the ring of x, with pairwise keys
  for (purpose, a, P_a, T) and a fresh self-mask seed b_a (OS CSPRNG); T is the hash of the
  public values this party accepted so far in the scope (its transcript, docs/design.md §2.5);
- step <name>_confirm: push T ‖ C ‖ Sig(session, name, a, P_a, T, C) under this party's identity
  key, C the commitment to b_a; the coordinator then relays every member's confirmation to every
  member (a seed relayed later must open its member's C);
- step <name>_reveal: push digest(session, name, a, P_a) ‖ b_a, only if every member of P_a
  signed the same T as this party (verified under the identity keys pinned on the roster), only
  for the latest attempt this party masked, only if the coordinator names exactly that attempt's
  participants (all of them contributed), and only once; after revealing, take part in no later
  attempt of the sum. A coordinator that showed parties different views opens nothing.
A verifiable sum (FedAvg, docs/design.md §2.7): before the confirm step the coordinator relays every
member's masked vector (<name>_vectors; this party's own must be there unchanged) and the
confirmation signs them too; once the sum is opened it relays every self-mask seed
(<name>_seeds), and the party recomputes the sum itself (`on_opened`).
With its masked vector the party deals every other member a sealed Shamir share of b_a, and it
gives its shares of a lost holder's seed in step <name>_recover under the rules of
client/phases/seed_shares.py, so that a holder lost while revealing does not lose the sum.
So an active coordinator can open one attempt of a sum, never two: claiming a dropout after a
complete attempt gets it a second masked sum it can never open, or the first one, not both. An
attempt this party has left is dead to it (xclp.v1.double_masking.dead_attempt): it confirms,
reveals and gives shares for the latest attempt it masked only, and masking attempt a + 1 destroys
its seed, masks, pushed vector and held shares of every earlier attempt. The session's step guard
(client/policy.py) adds that a restart must strictly shrink the set.
"""

from __future__ import annotations

import enum
import hashlib
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from xclp.client.context import PartyContext
from xclp.client.ledger import Release
from xclp.client.phases.seed_shares import SeedShares
from xclp.client.transcript import payload_digest
from xclp.crypto.identity import verify_signature
from xclp.crypto.masking import ring_sum
from xclp.errors import InvalidInput, ProtocolError
from xclp.v1 import wire
from xclp.v1 import xclp_pb2 as pb
from xclp.v1.double_masking import (
    CONFIRM_BYTES,
    CONFIRM_SUFFIX,
    SEALED_SHARE_BYTES,
    SEED_BYTES,
    SEEDS_SUFFIX,
    VECTORS_SUFFIX,
    Confirmation,
    commit_seed,
    confirm_message,
    confirm_step,
    dead_attempt,
    pack_reveal,
    recover_step,
    reveal_digest,
    reveal_step,
    seeds_message,
    self_mask,
    vectors_message,
)

Members = tuple[str, ...]
# A party's array for an attempt among these participants (before any mask), in its ring.
Contribution = Callable[[Members], np.ndarray]
# (the pairwise-masked array, participants) -> (what is pushed, what the party keeps for later)
Withhold = Callable[[np.ndarray, Members], tuple[np.ndarray, np.ndarray]]
# a verifiable sum, recomputed by this party: (the ring sum, attempt, participants)
Opened = Callable[[np.ndarray, int, Members], None]
# an exact sum: the functions of the data it releases among these participants (client/ledger.py)
Releases = Callable[[Members], Sequence[Release]]


class Noisy(enum.Enum):
    """A sum with DP noise: the ledger charges it as the job's DP releases (JobParams.dp_releases)
    rather than checking it as an exact release."""

    DP = "dp"


@dataclass
class SelfMasks:
    """The self-mask seeds of one masked sum, and the rules this party keeps before revealing one."""

    step: str  # the step name the reveal digest binds
    session_id: bytes
    # attempt -> (seed, members); the seed of every attempt but the latest is destroyed (None)
    attempts: dict[int, tuple[bytes | None, Members]] = field(default_factory=dict)
    revealed_attempt: tuple[int, Members] | None = None  # the attempt whose seed this party revealed

    @property
    def revealed(self) -> bool:
        return self.revealed_attempt is not None

    def add(self, values: np.ndarray, attempt: int, members: Members | list[str]) -> np.ndarray:
        """values + PRG(b) in the ring of values.dtype, with a fresh b for (attempt, members)."""
        if self.revealed:
            raise ProtocolError(f"step {self.step!r} attempt {attempt} started after this party revealed its self "
                                "mask for the step: only one attempt of a sum is ever opened")
        if attempt in self.attempts:
            raise ProtocolError(f"step {self.step!r} attempt {attempt} started twice")
        for earlier, (_, members_before) in self.attempts.items():  # left for this one: dead to this party
            self.attempts[earlier] = (None, members_before)
        seed = secrets.token_bytes(SEED_BYTES)
        self.attempts[attempt] = (seed, tuple(sorted(members)))
        return values + self_mask(seed, values.shape, values.dtype)  # wraps in the ring

    def reveal(self, attempt: int, members: Members | list[str]) -> bytes:
        """digest ‖ b for the coordinator, if the rules allow it (else ProtocolError)."""
        seed, mine = self.check(attempt, members)
        self.revealed_attempt = (attempt, mine)
        return pack_reveal(reveal_digest(self.session_id, self.step, attempt, mine), seed)

    @property
    def latest(self) -> int | None:
        """The latest attempt this party masked: the only one it may still confirm or reveal."""
        return max(self.attempts, default=None)

    def live(self, attempt: int, asked: str) -> tuple[bytes, Members]:
        """The seed and members of `attempt` if it is the latest this party masked (else ProtocolError:
        an attempt this party has left is dead to it)."""
        dead = dead_attempt(attempt, self.latest if attempt in self.attempts else None)
        seed, members = self.attempts.get(attempt, (None, ()))
        if dead is not None or seed is None:
            raise ProtocolError(f"the coordinator asked {asked} {self.step} attempt {attempt}, "
                                f"{dead or 'whose seed this party destroyed'}")
        return seed, members

    def check(self, attempt: int, members: Members | list[str]) -> tuple[bytes, Members]:
        """The seed and members of `attempt` if the rules allow revealing it (else ProtocolError)."""
        if self.revealed:
            raise ProtocolError(f"the coordinator asked twice for this party's self mask of step {self.step!r}")
        seed, mine = self.live(attempt, "for the self mask of")
        if tuple(sorted(members)) != mine:
            raise ProtocolError(f"the coordinator reports step {self.step!r} attempt {attempt} complete for "
                                f"{sorted(members)}, but the attempt was among {list(mine)}")
        return seed, mine


class SumStage(enum.Enum):
    """Where an attempt of this party's masked sum is: each step moves it on once, in this order
    (as Flower's secure aggregation checks its stage); an attempt the party has left has none."""

    MASKED = "masked"  # its masked array (and its shares of its self-mask seed) pushed
    CONFIRMED = "confirmed"  # its transcript hash and seed commitment signed
    REVEALED = "revealed"  # its self-mask seed revealed: the attempt opens
    RECOVERED = "gave shares"  # its shares of lost holders' seeds given


@dataclass(eq=False)
class Attempt:
    """All this party holds of the one attempt of the sum it is in (the latest it masked). Masking a
    later attempt replaces the record whole, so nothing of a left attempt stays reachable through
    the party (its seed is SelfMasks', its shares SeedShares', both dropped there too)."""

    number: int
    stage: SumStage
    transcript: bytes  # the transcript hash its masks were drawn under
    released: Sequence[Release] | None  # what its contribution releases (an exact sum, with a ledger)
    pushed: np.ndarray | None  # a verifiable sum: what this party pushed
    kept: np.ndarray | None  # what `withhold` kept back of the masked array
    confirmed: bytes | None = None  # the hash this party confirmed
    confirms: bytes | None = None  # every member's confirmation, as the coordinator relayed them
    vectors: np.ndarray | None = None  # a verifiable sum: every member's masked vector, as relayed
    commitments: dict[str, bytes] | None = None  # member -> its signed seed commitment


class MaskedSumParty:
    """This party's side of the masked sum `name` (the steps `name`, `name`_confirm, `name`_reveal)."""

    def __init__(self, ctx: PartyContext, name: str, contribution: Contribution, *, purpose: str | None = None,
                 withhold: Withhold | None = None, digest_name: str | None = None, releases: Releases | Noisy,
                 on_opened: Opened | None = None) -> None:
        """releases: what the sum releases of the party's data, which every sum must say: what
        an exact sum releases, which the ledger reserves before masking, among the data set's one
        set of parties (client/ledger.py), or Noisy.DP for a sum with DP noise, which the
        job's DP spends pay for (charged before the first masked push of any sum). on_opened: the sum is
        verifiable, and this is told the sum as this party recomputed it from every member's masked
        vector and seed."""
        self.ctx = ctx
        if releases is Noisy.DP and ctx.account is not None and not ctx.account.spends:
            raise ProtocolError(f"the masked sum {name!r} is noisy, but the job declares no DP release for the "
                                "ledger to charge: not releasing it")
        self.releases = releases
        self.attempt: Attempt | None = None  # the attempt this party is in (Attempt)
        self.name = name
        self.confirm_name = confirm_step(name)
        self.reveal_name = reveal_step(name)
        self.recover_name = recover_step(name)
        self.on_opened = on_opened
        # the coordinator's relays of this sum, and (on the masked step) peers' sealed seed shares
        self.relays = frozenset(ctx.prefix + relay for relay in (name, confirm_step(name), vectors_message(name),
                                                                 seeds_message(name)))
        self.contribution = contribution
        self.purpose = name if purpose is None else purpose  # the pairwise masks' HKDF purpose
        self.withhold = withhold
        self.self_masks = SelfMasks(ctx.prefix + name if digest_name is None else digest_name, ctx.session_id)
        self.shares = SeedShares(ctx, name, self.self_masks.step)

    def handles(self, step: str) -> bool:
        """Whether a step (named in the context's scope) is one of this sum's."""
        return step in (self.name, self.confirm_name, self.reveal_name, self.recover_name)

    def receives(self, step: str) -> bool:
        """Whether a message's wire name is one of this sum's relays (RelayedPhase)."""
        return step in self.relays

    def _at(self, attempt: int) -> Attempt | None:
        """The record of `attempt` (None: this party never masked it, or has left it)."""
        return self.attempt if self.attempt is not None and self.attempt.number == attempt else None

    def stage(self, attempt: int) -> SumStage | None:
        """Where `attempt` is here (None: this party never masked it, or has left it)."""
        record = self._at(attempt)
        return None if record is None else record.stage

    def _advance(self, attempt: int, before: SumStage, after: SumStage, doing: str) -> None:
        """Move `attempt` from `before` to `after`, or refuse: each step once, in order."""
        record = self._at(attempt)
        if record is None or record.stage is not before:
            now = "not masked by this party" if record is None else record.stage.value
            raise ProtocolError(f"the coordinator asked this party {doing} {self.ctx.prefix}{self.name} attempt "
                                f"{attempt}, which is {now} here ({before.value} expected)")
        record.stage = after

    def withheld(self, attempt: int) -> np.ndarray | None:
        """What `withhold` kept back of this party's masked array in `attempt` (None: it masked no such
        attempt, or has left it)."""
        record = self._at(attempt)
        return None if record is None else record.kept

    def on_step(self, step: pb.StepStart) -> int:
        """Push this party's part of `step` (named in the context's scope); returns the bytes pushed."""
        members, attempt = tuple(step.participants), step.round
        if step.step == self.confirm_name:
            confirmation = self._confirmation(attempt, members)
            self._advance(attempt, SumStage.MASKED, SumStage.CONFIRMED, "to confirm")
            return self.ctx.push(confirmation, self.confirm_name, attempt)
        if step.step == self.reveal_name:  # the attempt is complete: open it, if every member saw what we saw
            self.self_masks.check(attempt, members)
            self._check_confirmations(attempt, members)
            self._advance(attempt, SumStage.CONFIRMED, SumStage.REVEALED, "to reveal")
            record = self._at(attempt)
            if self.ctx.account is not None and record is not None and record.released is not None:
                self.ctx.account.revealing()  # recorded first: an unwritable ledger stops us
            sent = self.ctx.push(self.self_masks.reveal(attempt, members), self.reveal_name, attempt)
            self.ctx.progress(f"{self.ctx.prefix}{self.name} attempt {attempt} complete among {len(members)} parties: "
                              "self mask revealed")
            return sent
        if step.step == self.recover_name:  # holders were lost while revealing: rebuild their seeds
            given = self.shares.give(attempt, members, self.self_masks.revealed_attempt)
            self._advance(attempt, SumStage.REVEALED, SumStage.RECOVERED, "for its shares of lost holders' seeds in")
            sent = self.ctx.push(given, self.recover_name, attempt)
            self.ctx.progress(f"{self.ctx.prefix}{self.name} attempt {attempt}: gave this party's shares of "
                              f"{len(self.self_masks.attempts[attempt][1]) - len(members)} lost holders' self masks")
            return sent
        if step.step != self.name:
            raise ProtocolError(f"step {step.step!r} is not part of the masked sum {self.name!r}")
        previous = self.self_masks.latest
        left = self._at(previous) if previous is not None else None
        self.shares.check_attempt(attempt, members, None if previous is None else
                                  (previous, self.self_masks.attempts[previous][1]),
                                  left is not None and left.confirmed is not None)
        shrunk = previous is not None and previous < attempt  # this party left an attempt among more parties
        self._leave_earlier(attempt)
        values = self.contribution(members)
        released = None
        if self.ctx.account is not None:  # reserved in the ledger before anything of the data is masked and sent
            self.ctx.account.charge()
            if not isinstance(self.releases, Noisy):
                released = tuple(self.releases(members))
                self.ctx.account.reserve_exact(released, members, shrunk=shrunk)
        transcript = self.ctx.transcript.digest  # after the contribution: it may absorb what it used
        masked = self.ctx.masker.apply(values, purpose=self.purpose, attempt=attempt, participants=members,
                                       transcript=transcript)
        kept = None
        if self.withhold is not None:
            masked, kept = self.withhold(masked, members)
        pushed = self.self_masks.add(masked, attempt, members)
        shares = self.shares.deal(self.self_masks.live(attempt, "to deal shares of")[0], attempt, members)
        self.attempt = Attempt(attempt, SumStage.MASKED, transcript, released,
                               pushed if self.on_opened is not None else None, kept)
        return self.ctx.push_all([*shares, wire.Outgoing(pushed, self.name, attempt)])  # shares first, one round trip

    def _leave_earlier(self, attempt: int) -> None:
        """Masking `attempt`: every earlier attempt is dead to this party. Its record goes whole
        (masked vectors, what it withheld, others' vectors and commitments), its shares of others'
        seeds here, its seeds by SelfMasks.add."""
        self.attempt = None
        for earlier in [a for a in self.shares.held if a < attempt]:
            del self.shares.held[earlier]

    def on_relay(self, message: wire.Message) -> None:
        """A peer's sealed seed share, or the coordinator's relay of every member's confirmation
        (or, for a verifiable sum, masked vector or seed) of an attempt."""
        if message.sender:
            self.shares.on_share(message, self.self_masks.attempts)
            return
        if message.step.endswith(VECTORS_SUFFIX):
            self._on_vectors(message)
            return
        if message.step.endswith(SEEDS_SUFFIX):
            self._on_seeds(message)
            return
        if not isinstance(message.payload, bytes):
            raise ProtocolError(f"the confirmations of {self.ctx.prefix}{self.name} must be opaque bytes")
        record = self._at(message.round)
        if record is not None and record.confirms is not None:
            raise ProtocolError(f"the coordinator relayed the confirmations of {self.ctx.prefix}{self.name} attempt "
                                f"{message.round} twice")
        if message.round != self.self_masks.latest or record is None:
            dead = dead_attempt(message.round, self.self_masks.latest) or "which this party did not mask"
            raise ProtocolError(f"the coordinator relayed the confirmations of {self.ctx.prefix}{self.name} attempt "
                                f"{message.round}, {dead}")
        record.confirms = message.payload

    def payload_limit(self, step: str, sender: str) -> int:
        """A peer's seed share; the coordinator's relays of this sum: confirmations, masked vectors, seeds."""
        members = len(self.ctx.roster.party_ids)
        if sender:
            return SEALED_SHARE_BYTES
        if step.endswith(CONFIRM_SUFFIX):
            return CONFIRM_BYTES * members
        if step.endswith(SEEDS_SUFFIX):
            return SEED_BYTES * members
        pushed = None if self.attempt is None else self.attempt.pushed
        return members * (0 if pushed is None else pushed.nbytes)

    def _on_vectors(self, message: wire.Message) -> None:
        attempt, what = message.round, f"{self.ctx.prefix}{self.name} attempt {message.round}"
        record = self._at(attempt)
        mine = None if record is None else record.pushed
        if self.on_opened is None or record is None or mine is None or record.vectors is not None:
            raise ProtocolError(f"the coordinator relayed masked vectors of {what}, which this party does not expect")
        members = self.self_masks.attempts[attempt][1]
        vectors = message.payload
        if (not isinstance(vectors, np.ndarray) or vectors.dtype != mine.dtype
                or vectors.shape != (len(members), *mine.shape)):
            raise ProtocolError(f"the masked vectors of {what} must be {mine.dtype.str}{[len(members), *mine.shape]}")
        if not np.array_equal(vectors[members.index(self.ctx.party_id)], mine):
            raise ProtocolError(f"the masked vectors of {what} carry another vector for this party than it sent")
        record.vectors = vectors

    def _on_seeds(self, message: wire.Message) -> None:
        attempt, what = message.round, f"{self.ctx.prefix}{self.name} attempt {message.round}"
        record = self._at(attempt)
        vectors, commitments = (None, None) if record is None else (record.vectors, record.commitments)
        if (self.on_opened is None or vectors is None or commitments is None
                or self.self_masks.revealed_attempt is None or self.self_masks.revealed_attempt[0] != attempt):
            raise ProtocolError(f"the coordinator relayed the seeds of {what}, which this party does not expect")
        members = self.self_masks.revealed_attempt[1]
        seeds = message.payload
        if not isinstance(seeds, bytes) or len(seeds) != SEED_BYTES * len(members):
            raise ProtocolError(f"the seeds of {what} must be {SEED_BYTES} bytes for each of {len(members)} members")
        parts = [seeds[i * SEED_BYTES:(i + 1) * SEED_BYTES] for i in range(len(members))]
        forged = [p for p, part in zip(members, parts)
                  if commit_seed(self.ctx.session_id, self.self_masks.step, attempt, p, part) != commitments[p]]
        if forged:
            raise ProtocolError(f"the seeds of {what} relayed for {', '.join(forged)} do not open the commitments "
                                "they signed before the reveal: not using the sum")
        dtype, shape = vectors.dtype, vectors.shape[1:]
        total = ring_sum(vectors[i] - self_mask(part, shape, dtype) for i, part in enumerate(parts))
        self.on_opened(total, attempt, members)

    def _confirmation(self, attempt: int, members: Members) -> bytes:
        """T ‖ Sig(session, step, attempt, members, T) for the attempt this party masked; for a
        verifiable sum T also binds every member's masked vector as relayed to this party."""
        seed, mine = self.self_masks.live(attempt, "to confirm")
        record = self._at(attempt)
        if record is None or mine != tuple(sorted(members)):
            raise ProtocolError(f"the coordinator asked to confirm {self.ctx.prefix}{self.name} attempt {attempt} "
                                f"among {sorted(members)}, which this party never masked")
        self.shares.check_held(attempt, members)
        transcript = record.transcript
        if self.on_opened is not None:
            vectors = record.vectors
            if vectors is None:
                raise ProtocolError(f"the coordinator asked to confirm {self.ctx.prefix}{self.name} attempt {attempt} "
                                    "before relaying every member's masked vector")
            transcript = hashlib.sha256(transcript + payload_digest(vectors)).digest()
        record.confirmed = transcript
        step = self.self_masks.step
        commitment = commit_seed(self.ctx.session_id, step, attempt, self.ctx.party_id, seed)
        message = confirm_message(self.ctx.session_id, step, attempt, sorted(members), transcript, commitment)
        return Confirmation(transcript, commitment, self.ctx.sign(message)).pack()

    def _check_confirmations(self, attempt: int, members: Members) -> None:
        """Every member signed this party's transcript hash for this attempt (docs/design.md §2.5)."""
        what = f"{self.ctx.prefix}{self.name} attempt {attempt}"
        record = self._at(attempt)
        relayed, mine = (None, None) if record is None else (record.confirms, record.confirmed)
        if record is None or relayed is None or mine is None:
            raise ProtocolError(f"the coordinator asked for this party's self mask of {what} without relaying every "
                                "member's signed transcript first")
        ordered = sorted(members)
        try:
            confirmations = Confirmation.unpack_all(relayed, len(ordered))
        except InvalidInput as exc:
            raise ProtocolError(f"the confirmations of {what}: {exc}") from None
        other = []
        for p, c in zip(ordered, confirmations):
            signed = confirm_message(self.ctx.session_id, self.self_masks.step, attempt, ordered, c.transcript,
                                     c.commitment)
            if not verify_signature(self.ctx.roster.bundle(p).identity_public, c.signature, signed):
                raise ProtocolError(f"the confirmation of {p!r} for {what} does not verify under its identity key: "
                                    "not revealing this party's self mask")
            if c.transcript != mine:
                other.append(p)
        if other:
            raise ProtocolError(f"the coordinator showed the parties different views before {what}: "
                                f"{', '.join(other)} signed another transcript than {self.ctx.party_id!r} (a spec, "
                                "layout, model, seed or set differs): not revealing this party's self mask")
        record.commitments = {p: c.commitment for p, c in zip(ordered, confirmations)}
