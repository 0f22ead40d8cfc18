"""Double masking (DESIGN §6.1): what parties and coordinator agree on for every masked sum.

In attempt a of a masked step with participant set P_a, party i sends
    y_i = x_i + PRG(b_i) + Σ_{j∈P_a, j≠i} ±PRG(k_ij)
with b_i a fresh 32-byte self-mask seed. When the coordinator holds every y_i of P_a it starts
the step's confirm step (same attempt, same participants): each party answers with
    T_i ‖ Sig_i(confirm(session, step, a, P_a, T_i))
where T_i is the hash of the public values it accepted (its transcript, DESIGN §2.5), which is
also in the HKDF info of its pairwise masks. The coordinator sends every member all members'
answers, then starts the reveal step; a party reveals only if every member signed its own T.
Each answers the reveal with
    digest(session, step, a, P_a) ‖ b_i
and the coordinator subtracts Σ PRG(b_i). A party reveals only for the latest attempt it masked,
only if the announced set is that attempt's set, and never takes part in a later attempt of the
step afterwards; so the coordinator can unmask at most one attempt of a step, and a lie about a
dropout (complete attempt, then "restart without j") leaves it one sum, never two. (An attempt
travels in the wire's `round` field; the phases on both ends are server/phases/masked_sum.py and
client/phases/masked_sum.py.)
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence

import numpy as np

from xclp.crypto.masking import keystream
from xclp.errors import InvalidInput

SEED_BYTES = 32
DIGEST_BYTES = 32
REVEAL_BYTES = DIGEST_BYTES + SEED_BYTES
REVEAL_SUFFIX = "_reveal"
CONFIRM_SUFFIX = "_confirm"
# a verifiable sum (FedAvg, DESIGN §2.7): every member gets every masked vector before it
# confirms, and every self-mask seed once the sum is opened, and recomputes the sum itself
VECTORS_SUFFIX = "_vectors"
SEEDS_SUFFIX = "_seeds"
SIGNATURE_BYTES = 64
CONFIRM_BYTES = DIGEST_BYTES + SIGNATURE_BYTES  # transcript hash ‖ Ed25519 signature
_CONFIRM_TAG = b"xclp/v1/transcript-confirm\x00"


def reveal_step(step: str) -> str:
    """The name of `step`'s reveal step ("sum" -> "sum_reveal")."""
    return step + REVEAL_SUFFIX


def confirm_step(step: str) -> str:
    """The name of `step`'s confirm step ("sum" -> "sum_confirm")."""
    return step + CONFIRM_SUFFIX


def confirm_message(session_id: bytes, step: str, attempt: int, participants: Sequence[str],
                    transcript: bytes) -> bytes:
    """What a party signs before any reveal of attempt `attempt` of `step`: the attempt (as the
    reveal digest binds it) and the hash of every public value it accepted."""
    if len(transcript) != DIGEST_BYTES:
        raise InvalidInput(f"a transcript hash is {DIGEST_BYTES} bytes")
    return _CONFIRM_TAG + reveal_digest(session_id, step, attempt, participants) + transcript


def reveal_digest(session_id: bytes, step: str, attempt: int, participants: Sequence[str]) -> bytes:
    """SHA-256 over the session, the step, the attempt and the sorted participant set."""
    h = hashlib.sha256(b"xclp/v1/double-masking")
    for part in (session_id, step.encode(), struct.pack(">Q", attempt), *(p.encode() for p in sorted(participants))):
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
