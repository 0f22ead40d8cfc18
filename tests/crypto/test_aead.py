"""AES-256-GCM sealing of the common seed (crypto/aead.py, docs/design.md §4.3)."""

from __future__ import annotations

import secrets

import pytest
from hypothesis import given
from hypothesis import strategies as st

from xclp.crypto.aead import SealBroken, open_sealed, seal
from xclp.errors import InvalidInput, ProtocolError

KEY = bytes(range(32))


@given(st.binary(max_size=200), st.binary(max_size=40))
def test_seal_open_round_trip(plaintext, aad):
    assert open_sealed(KEY, seal(KEY, plaintext, aad=aad), aad=aad) == plaintext


def test_each_seal_uses_a_fresh_nonce():
    assert seal(KEY, b"seed", aad=b"s") != seal(KEY, b"seed", aad=b"s")


def test_tampering_wrong_key_or_wrong_session_fails_loudly():
    sealed = seal(KEY, secrets.token_bytes(32), aad=b"session-1")
    for i in range(len(sealed)):
        with pytest.raises(SealBroken):
            open_sealed(KEY, sealed[:i] + bytes([sealed[i] ^ 0x80]) + sealed[i + 1 :], aad=b"session-1")
    with pytest.raises(SealBroken):
        open_sealed(bytes(32), sealed, aad=b"session-1")
    with pytest.raises(SealBroken):
        open_sealed(KEY, sealed, aad=b"session-2")
    with pytest.raises(SealBroken, match="too short"):
        open_sealed(KEY, sealed[:20], aad=b"session-1")
    assert issubclass(SealBroken, ProtocolError)


def test_key_must_be_256_bits():
    with pytest.raises(InvalidInput, match="32-byte"):
        seal(bytes(16), b"x", aad=b"")
