"""A payload one party seals for another, relayed by the coordinator (docs/design.md §2.2): one key schedule
and one AAD for every peer-to-peer payload of the protocol (the common seed, the self-mask seed
shares, SecureHamming's slices and evaluations).

The key is HKDF-SHA256 of the pair's X25519 secret, salted with the session id, for the relay's
purpose, attempt and the attempt's participants (crypto/kdf.py `derive_key`); the AAD binds the
session, purpose, step, attempt, sender and recipient. So the coordinator can drop a relay, never
read, forge, replay into another session, attempt or step, redirect to another recipient or reflect
it to its sender.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

from xclp.crypto import aead
from xclp.crypto.kdf import derive_key

_TAG = b"xclp/v1/relay"


@dataclass(frozen=True)
class Relay:
    """What one relayed payload is bound to."""

    purpose: str  # what it carries: "seed", "selfmask-share", "hamming", ...
    step: str  # the wire name of the step it travels in
    attempt: int
    participants: tuple[str, ...]  # the attempt's participants (sorted into the key)
    sender: str
    recipient: str

    @classmethod
    def of(cls, purpose: str, step: str, attempt: int, participants: Sequence[str], sender: str,
           recipient: str) -> Relay:
        return cls(purpose, step, attempt, tuple(sorted(participants)), sender, recipient)

    def key(self, pair_secret: bytes, session_id: bytes) -> bytes:
        """The pair's key for this purpose and attempt (both directions derive it alike)."""
        return derive_key(pair_secret, session_id=session_id, purpose=f"relay:{self.purpose}", attempt=self.attempt,
                          participants=self.participants)

    def aad(self, session_id: bytes) -> bytes:
        parts = (_TAG, session_id, self.purpose.encode(), self.step.encode(), struct.pack(">Q", self.attempt),
                 self.sender.encode(), self.recipient.encode())
        return b"".join(struct.pack(">I", len(p)) + p for p in parts)

    def seal(self, pair_secret: bytes, session_id: bytes, payload: bytes) -> bytes:
        return aead.seal(self.key(pair_secret, session_id), payload, aad=self.aad(session_id))

    def open(self, pair_secret: bytes, session_id: bytes, sealed: bytes) -> bytes:
        """The payload, or SealBroken (forged, replayed, redirected or reflected on the way)."""
        return aead.open_sealed(self.key(pair_secret, session_id), sealed, aad=self.aad(session_id))
