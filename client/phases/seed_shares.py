"""This party's Shamir shares of the self-mask seeds of one masked sum (docs/design.md §6.1).

With its masked vector of attempt a among P_a, a party deals its seed b: t-of-|P_a| shares
(crypto/shamir.py), one per other member, each sealed with AES-256-GCM under the pair's key for
(SHARE_PURPOSE, a, P_a) with the session, the step, the sender and the recipient in the AAD, and
relayed by the coordinator. It keeps the shares the others dealt it. When holders M are lost
while revealing, the coordinator starts the recover step among the holders R that revealed, and
this party gives its shares of every b_j, j ∈ M, only if

- it revealed its own seed of exactly that attempt (so every member signed one transcript, and
  it takes part in no later attempt of the sum);
- R is a strict subset of P_a that holds this party and at least t holders (fewer open nothing);
- it never gave shares for that attempt before (one recovery per attempt, so once per j).

b_j alone opens nothing of j's input: j's pairwise masks of the attempt still hide it. What b_j
must not do is open a second attempt of the sum (the coordinator would difference the two), so a
party that signed attempt a's confirmation (after which others may reveal a and give shares of its
b) joins a later attempt a' only if fewer than t members of P_a are outside P_{a'}: the parties
that could still reveal a are then too few to rebuild its seed of a.
"""

from __future__ import annotations

from xclp.client.context import PartyContext
from xclp.client.policy import check_share_threshold
from xclp.crypto import shamir
from xclp.errors import ProtocolError
from xclp.v1 import wire
from xclp.v1.double_masking import (
    SEALED_SHARE_BYTES,
    SHARE_PURPOSE,
    recover_digest,
    recoverable,
    share_index,
    share_threshold,
)
from xclp.v1.relay import Relay

Members = tuple[str, ...]


class SeedShares:
    """Deals this party's seed shares, keeps the others', and gives them out under the rules above."""

    def __init__(self, ctx: PartyContext, name: str, digest_step: str) -> None:
        self.ctx = ctx
        self.name = name  # the masked step, whose messages carry the shares
        self.step = ctx.prefix + name  # its wire name
        self.digest_step = digest_step  # the name the reveal digest binds
        self.configured = ctx.params.share_threshold
        self.held: dict[int, dict[str, bytes]] = {}  # attempt -> sender -> its share of the sender's seed
        self.recovered: set[int] = set()  # attempts this party gave shares for

    def threshold(self, members: Members) -> int:
        return share_threshold(self.configured, len(members))

    def recoverable(self, members: Members) -> bool:
        return recoverable(self.threshold(members), len(members))

    def check_attempt(self, attempt: int, members: Members, previous: tuple[int, Members] | None,
                      confirmed: bool) -> None:
        """Before masking attempt `attempt`: the threshold meets this party's policy, and a restart
        after this party confirmed `previous` leaves too few outside to open that attempt."""
        check_share_threshold(self.configured, len(members), self.ctx.min_share_threshold,
                              f"{self.step} attempt {attempt}")
        if previous is None or not confirmed:
            return
        before, earlier = previous
        outside = set(earlier) - set(members)
        t_before = self.threshold(earlier)
        if self.recoverable(earlier) and len(outside) >= t_before:
            raise ProtocolError(f"{self.step} restarted as attempt {attempt} without {len(outside)} of the parties of "
                                f"attempt {before}, whose transcript this party signed: {t_before} of them could open "
                                "that attempt with their shares of this party's seed, and the coordinator would "
                                "difference the two sums; not taking part")

    def deal(self, seed: bytes, attempt: int, members: Members) -> list[wire.Outgoing]:
        """Every other member's sealed share of `seed`, to push (relayed) before the masked vector."""
        if not self.recoverable(members):
            return []
        me = self.ctx.party_id
        shares = shamir.split(seed, self.threshold(members), [share_index(p, members) for p in members])
        return [wire.Outgoing(self._relay(attempt, members, me, peer).seal(
                    self.ctx.masker.secrets[peer], self.ctx.session_id, shares[share_index(peer, members)]),
                              self.name, attempt, peer)
                for peer in members if peer != me]

    def on_share(self, message: wire.Message, attempts: dict[int, tuple[bytes | None, Members]]) -> None:
        """A peer's sealed share of its seed, for the live attempt this party masked in."""
        attempt, sender = message.round, message.sender
        mine = attempts.get(attempt)
        if (mine is None or mine[0] is None or sender not in mine[1] or sender == self.ctx.party_id
                or not self.recoverable(mine[1])):
            raise ProtocolError(f"{sender!r} sent a self-mask share for {self.step} attempt {attempt}, which this "
                                "party does not expect")
        held = self.held.setdefault(attempt, {})
        if sender in held:
            raise ProtocolError(f"{sender!r} sent its self-mask share for {self.step} attempt {attempt} twice")
        if not isinstance(message.payload, bytes) or len(message.payload) != SEALED_SHARE_BYTES:
            raise ProtocolError(f"a sealed self-mask share is {SEALED_SHARE_BYTES} opaque bytes")
        share = self._relay(attempt, mine[1], sender, self.ctx.party_id).open(
            self.ctx.masker.secrets[sender], self.ctx.session_id, message.payload)
        if len(share) != shamir.SHARE_BYTES:
            raise ProtocolError(f"a self-mask share is {shamir.SHARE_BYTES} bytes")
        held[sender] = share

    def check_held(self, attempt: int, members: Members) -> None:
        """Before confirming: every other member's share is here (else no lost seed could be rebuilt)."""
        if not self.recoverable(members):
            return
        missing = sorted(set(members) - {self.ctx.party_id} - set(self.held.get(attempt, {})))
        if missing:
            raise ProtocolError(f"the coordinator asked to confirm {self.step} attempt {attempt} without relaying the "
                                f"self-mask shares of {', '.join(missing)}")

    def give(self, attempt: int, givers: Members, revealed: tuple[int, Members] | None) -> bytes:
        """digest ‖ this party's shares of the lost holders' seeds, if the rules allow it."""
        what = f"{self.step} attempt {attempt}"
        if revealed is None or revealed[0] != attempt:
            raise ProtocolError(f"the coordinator asked for self-mask shares of {what}, for which this party revealed "
                                "no seed of its own")
        holders = revealed[1]
        if attempt in self.recovered:
            raise ProtocolError(f"the coordinator asked twice for self-mask shares of {what}")
        outside = sorted(set(givers) - set(holders))
        if outside:
            raise ProtocolError(f"the coordinator asked for self-mask shares of {what} among {', '.join(outside)}, "
                                "who held no part of it")
        lost = [p for p in holders if p not in givers]
        if not lost:
            raise ProtocolError(f"the coordinator asked for self-mask shares of {what} with no holder lost")
        t = self.threshold(holders)
        if len(givers) < t:
            raise ProtocolError(f"the coordinator asked for self-mask shares of {what} from {len(givers)} holders; "
                                f"{t} are needed to open a seed")
        held = self.held.get(attempt, {})
        unheld = [p for p in lost if p not in held]
        if unheld:
            raise ProtocolError(f"this party holds no share of {', '.join(unheld)} for {what}")
        self.recovered.add(attempt)
        digest = recover_digest(self.ctx.session_id, self.digest_step, attempt, holders, givers)
        return digest + b"".join(held[p] for p in lost)

    def _relay(self, attempt: int, members: Members, sender: str, recipient: str) -> Relay:
        """A sealed share's binding (xclp.v1.relay): the sum's step, attempt and members, both ends."""
        return Relay.of(SHARE_PURPOSE, self.step, attempt, members, sender, recipient)
