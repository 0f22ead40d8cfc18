"""HKDF key derivation (docs/design.md §4.2): RFC 5869 vectors, binding of purpose/attempt/participants."""

from __future__ import annotations

import hashlib
import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from xclp.crypto.kdf import derive_key, hkdf_sha256, key_info, participant_set_digest
from xclp.errors import InvalidInput

SS = bytes(range(32))
SESSION = b"session-0001"

# RFC 5869 Appendix A, test cases 1 and 3 (SHA-256).
RFC5869_CASES = [
    (
        b"\x0b" * 22,
        bytes.fromhex("000102030405060708090a0b0c"),
        bytes.fromhex("f0f1f2f3f4f5f6f7f8f9"),
        42,
        "3cb25f25faacd57a90434f64d0362f2a2d2d0a90cf1a5a4c5db02d56ecc4c5bf34007208d5b887185865",
    ),
    (
        b"\x0b" * 22,
        b"",
        b"",
        42,
        "8da4e775a563c18f715f802a063c5a31b8a11f5c5ee1879ec3454e5f3c738d2d9d201395faa4b61a96c8",
    ),
]


@pytest.mark.parametrize(("ikm", "salt", "info", "length", "okm"), RFC5869_CASES)
def test_hkdf_matches_rfc5869_vectors(ikm: bytes, salt: bytes, info: bytes, length: int, okm: str) -> None:
    assert hkdf_sha256(ikm, salt=salt, info=info, length=length).hex() == okm


def test_derive_key_is_hkdf_with_documented_info() -> None:
    parts = ["bank", "alpha", "clinic"]
    digest = hashlib.sha256(b"alpha\nbank\nclinic").hexdigest()
    info = f"xclp/rowsums/3/{digest}".encode()
    assert key_info("rowsums", 3, parts) == info
    assert participant_set_digest(parts) == digest
    expected = hkdf_sha256(SS, salt=SESSION, info=info, length=32)
    assert derive_key(SS, session_id=SESSION, purpose="rowsums", attempt=3, participants=parts) == expected


def test_derive_key_length_option() -> None:
    k64 = derive_key(SS, session_id=SESSION, purpose="seed", attempt=0, participants=["a", "b"], length=64)
    k32 = derive_key(SS, session_id=SESSION, purpose="seed", attempt=0, participants=["a", "b"])
    assert len(k64) == 64 and k64[:32] == k32  # HKDF-Expand output is a prefix-stable stream


@given(st.permutations(["a", "b", "c", "d", "e"]))
def test_participant_order_does_not_matter(perm: list[str]) -> None:
    ref = derive_key(SS, session_id=SESSION, purpose="p", attempt=1, participants=["a", "b", "c", "d", "e"])
    assert derive_key(SS, session_id=SESSION, purpose="p", attempt=1, participants=perm) == ref


def test_every_binding_gives_a_distinct_key() -> None:
    secrets = [SS, bytes(32)]
    sessions = [SESSION, b"session-0002"]
    purposes = ["rowsums", "flynn", "seed"]
    attempts = [0, 1, 2]
    sets = [["a", "b"], ["a", "b", "c"], ["a", "c"]]
    keys = {
        derive_key(ss, session_id=sid, purpose=p, attempt=r, participants=ps)
        for ss, sid, p, r, ps in itertools.product(secrets, sessions, purposes, attempts, sets)
    }
    assert len(keys) == len(secrets) * len(sessions) * len(purposes) * len(attempts) * len(sets)


def test_digest_separator_prevents_id_merging() -> None:
    # "a\nb" as one id would collide with ids "a" and "b" — it is refused instead.
    with pytest.raises(InvalidInput, match="newline"):
        participant_set_digest(["a\nb"])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"purpose": ""}, "purpose must be a non-empty"),
        ({"purpose": "row/sums"}, "must not contain '/'"),
        ({"attempt": -1}, "attempt must be an integer >= 0"),
        ({"attempt": True}, "attempt must be an integer >= 0"),
        ({"attempt": 1.0}, "attempt must be an integer >= 0"),
        ({"participants": []}, "participants must not be empty"),
        ({"participants": ["a", "b", "a"]}, "repeated: a"),
        ({"participants": "ab"}, "not a single string"),
        ({"participants": ["a", ""]}, "non-empty string"),
        ({"session_id": b""}, "session_id must be non-empty"),
        ({"length": 0}, "length must be an integer"),
        ({"length": 255 * 32 + 1}, "length must be an integer"),
    ],
)
def test_bad_inputs_are_refused_with_a_reason(kwargs: dict[str, object], message: str) -> None:
    args: dict[str, object] = {"session_id": SESSION, "purpose": "p", "attempt": 0, "participants": ["a", "b"]}
    args.update(kwargs)
    with pytest.raises(InvalidInput, match=message):
        derive_key(SS, **args)  # type: ignore[arg-type]


def test_empty_shared_secret_refused() -> None:
    with pytest.raises(InvalidInput, match="shared_secret"):
        derive_key(b"", session_id=SESSION, purpose="p", attempt=0, participants=["a"])
