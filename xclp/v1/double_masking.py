"""Double masking (docs/design.md §6.1): what parties and coordinator agree on for every masked sum.

In attempt a of a masked step with participant set P_a, party i sends
    y_i = x_i + PRG(b_i) + Σ_{j∈P_a, j≠i} ±PRG(k_ij)
with b_i a fresh 32-byte self-mask seed. When the coordinator holds every y_i of P_a it starts
the step's confirm step (same attempt, same participants): each party answers with
    T_i ‖ C_i ‖ Sig_i(confirm(session, step, a, P_a, T_i, C_i))
where T_i is the hash of the public values it accepted (its transcript, docs/threat-model.md), which
is also in the HKDF info of its pairwise masks, and C_i = commit(session, step, a, i, b_i) commits
to the self-mask seed it may reveal later: a seed relayed or rebuilt for i is used by nobody unless
it opens C_i. The coordinator sends every member all members' answers, then starts the reveal step;
a party reveals only if every member signed its own T.
Each answers the reveal with
    digest(session, step, a, P_a) ‖ b_i
and the coordinator subtracts Σ PRG(b_i). A party reveals only for the latest attempt it masked,
only if the announced set is that attempt's set, and never takes part in a later attempt of the
step afterwards; so the coordinator can unmask at most one attempt of a step, and a lie about a
dropout (complete attempt, then "restart without j") leaves it one sum, never two. (An attempt
travels in the wire's `round` field; the phases on both ends are server/phases/masked_sum.py and
client/phases/masked_sum.py.)

An attempt a party has left is dead to it (`dead_attempt`, the one rule both ends apply): it
confirms, reveals and gives shares only for the latest attempt it masked, and on masking attempt
a + 1 destroys its seeds, masks and held shares of every earlier one. Otherwise a coordinator could
open attempt a among P_a beside attempt a + 1 among P_{a+1} ⊊ P_a, the parties of P_a − P_{a+1}
revealing their seeds of a (it is their latest) and rebuilding the others' from their shares: the
difference of the two sums is the exact sum of P_a − P_{a+1}.

A holder lost while revealing (Bonawitz et al. 2017 §4): with its masked vector each
party i sends every other member j a Shamir share of b_i (t-of-|P_a|, crypto/shamir.py, index =
position in sorted P_a + 1), sealed for that member as every peer-to-peer payload is
(xclp.v1.relay: the pair's key for SHARE_PURPOSE, a and P_a; session, step, sender and recipient
in the AAD). If holders M do not reveal, the coordinator
starts the step's recover step (same attempt) among the holders R = P_a − M that revealed; each
answers recover_digest(session, step, a, P_a, R) ‖ its shares of every b_j, j ∈ M (sorted). Any t
shares give b_j; b_j alone opens nothing of j (its pairwise masks still hide x_j). t is the job's
`share_threshold`, or a majority ⌊|P_a|/2⌋ + 1; with t > |P_a| − 1 (two parties, say) nobody can
be recovered and no shares are sent.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from xclp.crypto import aead
from xclp.crypto.masking import keystream
from xclp.crypto.shamir import SHARE_BYTES
from xclp.errors import InvalidInput

SEED_BYTES = 32
DIGEST_BYTES = 32
REVEAL_BYTES = DIGEST_BYTES + SEED_BYTES
REVEAL_SUFFIX = "_reveal"
CONFIRM_SUFFIX = "_confirm"
# a verifiable sum (FedAvg, docs/design.md §2.7): every member gets every masked vector before it
# confirms, and every self-mask seed once the sum is opened, and recomputes the sum itself
VECTORS_SUFFIX = "_vectors"
SEEDS_SUFFIX = "_seeds"
SIGNATURE_BYTES = 64
CONFIRM_BYTES = 2 * DIGEST_BYTES + SIGNATURE_BYTES  # transcript hash ‖ seed commitment ‖ Ed25519 signature
_CONFIRM_TAG = b"xclp/v1/transcript-confirm/2\x00"
_COMMIT_TAG = b"xclp/v1/selfmask-commit"
RECOVER_SUFFIX = "_recover"
SHARE_PURPOSE = "selfmask-share"  # HKDF purpose of the keys that seal self-mask shares
SEALED_SHARE_BYTES = aead.NONCE_BYTES + SHARE_BYTES + aead.TAG_BYTES
MIN_SHARE_THRESHOLD = 2


def recover_step(step: str) -> str:
    """The name of `step`'s recover step ("sum" -> "sum_recover")."""
    return step + RECOVER_SUFFIX


def vectors_message(step: str) -> str:
    """A verifiable sum's relay of every member's masked vector ("sum" -> "sum_vectors")."""
    return step + VECTORS_SUFFIX


def seeds_message(step: str) -> str:
    """A verifiable sum's relay of every member's self-mask seed ("sum" -> "sum_seeds")."""
    return step + SEEDS_SUFFIX


def share_threshold(configured: int, holders: int) -> int:
    """t for an attempt among `holders` parties: the job's `share_threshold`, or (0) a majority."""
    return configured if configured else holders // 2 + 1


def recoverable(threshold: int, holders: int) -> bool:
    """Whether a lost holder's seed can be rebuilt: t shares from the others (so 3 parties at least)."""
    return MIN_SHARE_THRESHOLD <= threshold <= holders - 1


def share_index(party: str, holders: Sequence[str]) -> int:
    """The Shamir index of `party` among `holders` (1-based, in sorted order)."""
    return sorted(holders).index(party) + 1


def recover_digest(session_id: bytes, step: str, attempt: int, holders: Sequence[str], givers: Sequence[str]) -> bytes:
    """SHA-256 over the attempt (as the reveal digest binds it) and the holders giving shares."""
    return _framed_digest(b"xclp/v1/recover", reveal_digest(session_id, step, attempt, holders),
                          *(p.encode() for p in sorted(givers)))


def recovery_bytes(missing: int) -> int:
    """The bytes of one holder's answer in a recover step for `missing` lost holders."""
    return DIGEST_BYTES + missing * SHARE_BYTES


def unpack_recovery(payload: object, missing: int) -> tuple[bytes, list[bytes]]:
    """(digest, [share of each lost holder's seed, in sorted order]); InvalidInput if malformed."""
    if not isinstance(payload, bytes) or len(payload) != recovery_bytes(missing):
        raise InvalidInput(f"a recovery answer for {missing} lost holders is {recovery_bytes(missing)} opaque bytes")
    shares = payload[DIGEST_BYTES:]
    return payload[:DIGEST_BYTES], [shares[i * SHARE_BYTES:(i + 1) * SHARE_BYTES] for i in range(missing)]


def reveal_step(step: str) -> str:
    """The name of `step`'s reveal step ("sum" -> "sum_reveal")."""
    return step + REVEAL_SUFFIX


def confirm_step(step: str) -> str:
    """The name of `step`'s confirm step ("sum" -> "sum_confirm")."""
    return step + CONFIRM_SUFFIX


def dead_attempt(attempt: int, latest: int | None) -> str | None:
    """Why attempt `attempt` of a sum may not be confirmed, revealed or recovered by a party whose
    latest masked attempt is `latest` (None if it may): an attempt a party has left is dead to it."""
    if latest is None:
        return "which this party never masked"
    if attempt < latest:
        return f"which this party left for attempt {latest}"
    if attempt > latest:
        return "which this party never masked"
    return None


def commit_seed(session_id: bytes, step: str, attempt: int, party: str, seed: bytes) -> bytes:
    """C = SHA-256 over the attempt, the party and its self-mask seed (32 random bytes, so C hides
    it): signed in the party's confirmation, it is what any seed relayed or rebuilt for it must open."""
    if len(seed) != SEED_BYTES:
        raise InvalidInput(f"a self-mask seed is {SEED_BYTES} bytes, got {len(seed)}")
    return _framed_digest(_COMMIT_TAG, session_id, step.encode(), struct.pack(">Q", attempt), party.encode(), seed)


@dataclass(frozen=True)
class Confirmation:
    """One member's confirmation of an attempt: T ‖ C ‖ Sig(confirm(session, step, a, P_a, T, C))."""

    transcript: bytes
    commitment: bytes
    signature: bytes

    def pack(self) -> bytes:
        return self.transcript + self.commitment + self.signature

    @classmethod
    def unpack(cls, payload: object) -> Confirmation:
        if not isinstance(payload, bytes) or len(payload) != CONFIRM_BYTES:
            raise InvalidInput(f"a confirmation is {CONFIRM_BYTES} opaque bytes (transcript hash, seed commitment, "
                               "signature)")
        return cls(payload[:DIGEST_BYTES], payload[DIGEST_BYTES:2 * DIGEST_BYTES], payload[2 * DIGEST_BYTES:])

    @classmethod
    def unpack_all(cls, payload: object, members: int) -> list[Confirmation]:
        """Every member's confirmation, as the coordinator relays them (sorted members' order)."""
        if not isinstance(payload, bytes) or len(payload) != CONFIRM_BYTES * members:
            raise InvalidInput(f"the confirmations of {members} members are {CONFIRM_BYTES} bytes each")
        return [cls.unpack(payload[i * CONFIRM_BYTES:(i + 1) * CONFIRM_BYTES]) for i in range(members)]


def confirm_message(session_id: bytes, step: str, attempt: int, participants: Sequence[str],
                    transcript: bytes, commitment: bytes) -> bytes:
    """What a party signs before any reveal of attempt `attempt` of `step`: the attempt (as the
    reveal digest binds it), the hash of every public value it accepted and its seed commitment."""
    if len(transcript) != DIGEST_BYTES or len(commitment) != DIGEST_BYTES:
        raise InvalidInput(f"a transcript hash and a seed commitment are {DIGEST_BYTES} bytes each")
    return _CONFIRM_TAG + reveal_digest(session_id, step, attempt, participants) + transcript + commitment


def reveal_digest(session_id: bytes, step: str, attempt: int, participants: Sequence[str]) -> bytes:
    """SHA-256 over the session, the step, the attempt and the sorted participant set."""
    return _framed_digest(b"xclp/v1/double-masking", session_id, step.encode(), struct.pack(">Q", attempt),
                          *(p.encode() for p in sorted(participants)))


def _framed_digest(tag: bytes, *parts: bytes) -> bytes:
    """SHA-256 over `tag` and each part prefixed by its 4-byte length (so no two lists of parts collide)."""
    h = hashlib.sha256(tag)
    for part in parts:
        h.update(struct.pack(">I", len(part)) + part)
    return h.digest()


def self_mask(seed: bytes, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """PRG(b): the self mask of `shape` in the ring of `dtype` (uint32 or uint64), AES-256-CTR."""
    if len(seed) != SEED_BYTES:
        raise InvalidInput(f"a self-mask seed is {SEED_BYTES} bytes, got {len(seed)}")
    return keystream(seed, int(np.prod(shape, dtype=np.int64)), dtype).reshape(shape)


def pack_reveal(digest: bytes, seed: bytes) -> bytes:
    return digest + seed


def unpack_reveal(payload: object) -> tuple[bytes, bytes]:
    """(digest, seed) from a reveal payload; InvalidInput if it is not 64 opaque bytes."""
    if not isinstance(payload, bytes) or len(payload) != REVEAL_BYTES:
        raise InvalidInput(f"a self-mask reveal is {REVEAL_BYTES} opaque bytes (digest and seed)")
    return payload[:DIGEST_BYTES], payload[DIGEST_BYTES:]
