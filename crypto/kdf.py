"""Key derivation for pairwise secrets (docs/design.md §4.2).

Every key the protocols use is derived from a pairwise X25519 secret by HKDF-SHA256 (RFC 5869):

    key = HKDF-SHA256(ss_ij, salt=session_id, info=b"xclp/<purpose>/<attempt>/<digest>")

where `digest` is the SHA-256 hex digest of the sorted participant ids joined by "\\n". Binding the
purpose, the attempt (a step's retry number; docs/design.md §4.2 calls it the round) and the participant
set into `info` gives a fresh key for every step and every restart: a step restarted without a
dropped party has a different participant set, and a retry with the same set must use a new
attempt, so no mask is ever reused (docs/design.md §4.2, §5.6).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from xclp.errors import InvalidInput

# RFC 5869 §2.3: L <= 255 * HashLen.
MAX_KEY_LENGTH = 255 * 32


def participant_set_digest(participants: Iterable[str]) -> str:
    """SHA-256 hex digest of the sorted participant ids joined by "\\n" (order does not matter).

    Ids must be non-empty strings without a newline (the separator) and must be unique; the set
    must not be empty.
    """
    ids = _check_participants(participants)
    return hashlib.sha256("\n".join(sorted(ids)).encode("utf-8")).hexdigest()


def key_info(purpose: str, attempt: int, participants: Iterable[str]) -> bytes:
    """The HKDF `info` string b"xclp/<purpose>/<attempt>/<participant-set digest>" (docs/design.md §4.2)."""
    if not isinstance(purpose, str) or not purpose:
        raise InvalidInput(f"purpose must be a non-empty string, got {purpose!r}")
    if "/" in purpose:
        # "/" separates the fields of `info`; allowing it would let two purposes collide.
        raise InvalidInput(f"purpose must not contain '/', got {purpose!r}")
    if isinstance(attempt, bool) or not isinstance(attempt, int) or attempt < 0:
        raise InvalidInput(f"attempt must be an integer >= 0, got {attempt!r}")
    digest = participant_set_digest(participants)
    return f"xclp/{purpose}/{attempt}/{digest}".encode()


def hkdf_sha256(ikm: bytes, *, salt: bytes, info: bytes, length: int = 32) -> bytes:
    """Plain HKDF-SHA256 (RFC 5869 extract-then-expand); `derive_key` is this with xclp's `info`."""
    for name, value in (("ikm", ikm), ("salt", salt), ("info", info)):
        if not isinstance(value, (bytes, bytearray)):
            raise InvalidInput(f"{name} must be bytes, got {type(value).__name__}")
    if isinstance(length, bool) or not isinstance(length, int) or not 1 <= length <= MAX_KEY_LENGTH:
        raise InvalidInput(f"length must be an integer in [1, {MAX_KEY_LENGTH}], got {length!r}")
    # RFC 5869 §2.2: an empty salt means HashLen zero bytes; `cryptography` wants None for that.
    hkdf = HKDF(algorithm=hashes.SHA256(), length=length, salt=bytes(salt) or None, info=bytes(info))
    return hkdf.derive(bytes(ikm))


def derive_key(
    shared_secret: bytes,
    *,
    session_id: bytes,
    purpose: str,
    attempt: int,
    participants: Iterable[str],
    length: int = 32,
    transcript: bytes = b"",
) -> bytes:
    """A `length`-byte key for one (session, purpose, attempt, participant set) from a pairwise secret.

    Both ends of a pair derive the same key because the secret is symmetric and the participant
    set is hashed in sorted order (docs/design.md §4.2). `transcript`, if given, is the hash of the public
    values the party accepted (docs/design.md §2.5): two parties with different views get different keys.
    """
    if not isinstance(shared_secret, (bytes, bytearray)) or len(shared_secret) == 0:
        raise InvalidInput("shared_secret must be non-empty bytes (the raw X25519 output)")
    if not isinstance(session_id, (bytes, bytearray)) or len(session_id) == 0:
        raise InvalidInput("session_id must be non-empty bytes (it salts every derived key)")
    info = key_info(purpose, attempt, participants)
    if transcript:
        info += b"/" + bytes(transcript).hex().encode()
    return hkdf_sha256(shared_secret, salt=session_id, info=info, length=length)


def _check_participants(participants: Iterable[str]) -> list[str]:
    if isinstance(participants, (str, bytes)):
        # A bare string is iterable but is certainly not a set of ids.
        raise InvalidInput("participants must be a collection of party ids, not a single string")
    try:
        ids = list(participants)
    except TypeError:
        raise InvalidInput(f"participants must be iterable, got {type(participants).__name__}") from None
    if not ids:
        raise InvalidInput("participants must not be empty")
    for pid in ids:
        if not isinstance(pid, str) or not pid:
            raise InvalidInput(f"every participant id must be a non-empty string, got {pid!r}")
        if "\n" in pid:
            raise InvalidInput(f"participant id {pid!r} contains a newline, the digest separator")
    if len(set(ids)) != len(ids):
        dupes = sorted({pid for pid in ids if ids.count(pid) > 1})
        raise InvalidInput(f"participants must be unique; repeated: {', '.join(dupes)}")
    return ids
