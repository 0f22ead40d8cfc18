"""AES-256-GCM sealing for small secrets relayed through the coordinator (docs/design.md §4.3).

The leader's common seed travels to each peer sealed under that pair's "seed" key with
AAD = session id, so the coordinator relays it without learning it. A sealed blob is
12-byte random nonce || ciphertext || 16-byte tag. Any tampering raises `SealBroken`.
"""

from __future__ import annotations

import secrets

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from xclp.errors import InvalidInput, ProtocolError

NONCE_BYTES = 12
TAG_BYTES = 16


class SealBroken(ProtocolError):
    """A sealed message failed authentication: wrong key, wrong AAD, or tampered bytes."""


def seal(key: bytes, plaintext: bytes, *, aad: bytes) -> bytes:
    if len(key) != 32:
        raise InvalidInput(f"AES-256-GCM needs a 32-byte key, got {len(key)}")
    nonce = secrets.token_bytes(NONCE_BYTES)
    return nonce + AESGCM(key).encrypt(nonce, plaintext, aad)


def open_sealed(key: bytes, sealed: bytes, *, aad: bytes) -> bytes:
    if len(key) != 32:
        raise InvalidInput(f"AES-256-GCM needs a 32-byte key, got {len(key)}")
    if len(sealed) < NONCE_BYTES + TAG_BYTES:
        raise SealBroken(f"sealed message of {len(sealed)} bytes is too short to be genuine")
    try:
        return AESGCM(key).decrypt(sealed[:NONCE_BYTES], sealed[NONCE_BYTES:], aad)
    except InvalidTag:
        raise SealBroken("sealed message failed authentication (wrong key, session or tampered)") from None
