"""Identity keys, signed key bundles and roster verification (crypto/identity.py, docs/design.md §4.1)."""

from __future__ import annotations

import secrets
from dataclasses import replace

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from hypothesis import given, settings
from hypothesis import strategies as st

from xclp.crypto import identity
from xclp.crypto.identity import KeyBundle, SignedBundle
from xclp.errors import ConfigError, InvalidInput, InvalidSignature


def bundle_for(key, party: str, job: str = "job-1", **extra) -> KeyBundle:
    return KeyBundle(party, job, identity.public_bytes(key), secrets.token_bytes(32), secrets.token_bytes(16), **extra)


@pytest.fixture(scope="module")
def keys():
    return {p: identity.generate_identity() for p in ("a", "b", "c")}


@pytest.fixture
def signed(keys):
    return {p: identity.sign_bundle(k, bundle_for(k, p)) for p, k in keys.items()}


def test_identity_key_pem_round_trips_and_other_pem_is_refused():
    key = identity.generate_identity()
    pem = identity.private_key_pem(key)
    assert pem.startswith(b"-----BEGIN PRIVATE KEY-----")
    assert identity.public_bytes(identity.load_private_key(pem)) == identity.public_bytes(key)
    with pytest.raises(ConfigError, match="a.key is not an unencrypted PEM"):
        identity.load_private_key(b"not a key", source="a.key")
    ec_key = ec.generate_private_key(ec.SECP256R1())
    ec_pem = ec_key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                  serialization.NoEncryption())
    with pytest.raises(ConfigError, match="holds a .*, not an Ed25519 identity key"):
        identity.load_private_key(ec_pem)


def test_allow_list_parses_and_refuses_bad_keys():
    key = identity.generate_identity()
    assert identity.allow_list({"a": identity.public_key_text(key)}) == {"a": identity.public_bytes(key)}
    with pytest.raises(ConfigError, match="allow.toml: party 'a'"):
        identity.allow_list({"a": "ssh-ed25519 AAAA"}, source="allow.toml")
    with pytest.raises(ConfigError, match=r"\[parties\]"):
        identity.allow_list(None)
    with pytest.raises(ConfigError, match="party id"):
        identity.allow_list({"a b": identity.public_key_text(key)})


def test_public_key_text_round_trips_and_rejects_garbage():
    key = identity.generate_identity()
    text = identity.public_key_text(key)
    assert text.startswith("ed25519:")
    assert identity.parse_public_key(text) == identity.public_bytes(key)
    for bad in ("rsa:AAAA", "ed25519:!!!", "ed25519:" + "QUJD"):
        with pytest.raises(ConfigError):
            identity.parse_public_key(bad)


@settings(max_examples=50, deadline=None)
@given(party=st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,20}", fullmatch=True),
       job=st.text(st.characters(min_codepoint=33, max_codepoint=0x2FFF), min_size=1,
                   max_size=40).filter(str.isprintable),
       n=st.binary(max_size=300), hs=st.binary(max_size=300))
def test_bundle_canonical_bytes_round_trip(party, job, n, hs):
    if bool(n) != bool(hs):
        n, hs = b"", b""
    b = KeyBundle(party, job, bytes(32), bytes(range(32)), bytes(16), n, hs)
    assert KeyBundle.from_bytes(b.canonical_bytes()) == b


def test_bundle_parsing_refuses_trailing_and_truncated_bytes(keys):
    data = bundle_for(keys["a"], "a").canonical_bytes()
    with pytest.raises(InvalidInput, match="trailing"):
        KeyBundle.from_bytes(data + b"\x00")
    with pytest.raises(InvalidInput):
        KeyBundle.from_bytes(data[:-1])
    with pytest.raises(InvalidInput, match="wrong tag"):
        KeyBundle.from_bytes(b"x" + data)


@pytest.mark.parametrize("old, why", [(b"xclp/key-bundle/v1", "which signs no job spec"),
                                      (b"xclp/key-bundle/v2", "cannot recover a party lost while revealing")])
def test_a_bundle_of_an_older_xclp_is_refused_with_what_to_do(keys, old: bytes, why: str):
    """A v2 party neither deals nor gives self-mask shares: its peers would refuse to
    confirm its sums, so it is named at the roster instead, with what to do."""
    data = bundle_for(keys["a"], "a").canonical_bytes()
    assert data.startswith(b"xclp/key-bundle/v3")
    with pytest.raises(InvalidInput, match=f"older xclp \\({old.decode()[5:]}, .*{why}\\): upgrade that party"):
        KeyBundle.from_bytes(old + data[len(b"xclp/key-bundle/v3"):])


def test_signature_verifies_and_every_flipped_byte_fails(keys, signed):
    assert identity.verify_bundle(signed["a"]).party_id == "a"
    data = signed["a"].bundle
    for i in range(0, len(data), 7):
        tampered = data[:i] + bytes([data[i] ^ 1]) + data[i + 1 :]
        with pytest.raises(InvalidSignature):
            identity.verify_bundle(SignedBundle(tampered, signed["a"].signature))
    bad_sig = bytes([signed["a"].signature[0] ^ 1]) + signed["a"].signature[1:]
    with pytest.raises(InvalidSignature, match="bad signature"):
        identity.verify_bundle(SignedBundle(data, bad_sig))


def test_bundle_naming_anothers_key_is_refused(keys):
    # Party b's bundle claiming a's identity key cannot be signed by b...
    with pytest.raises(InvalidInput, match="another identity key"):
        identity.sign_bundle(keys["b"], bundle_for(keys["a"], "b"))
    # ...and one self-consistently signed by b does not match a's pinned key.
    s = identity.sign_bundle(keys["b"], bundle_for(keys["b"], "a"))
    with pytest.raises(InvalidSignature, match="other than its allowed"):
        identity.verify_bundle(s, expected_identity=identity.public_bytes(keys["a"]))


def test_roster_verifies_and_session_id_is_order_free(signed):
    items = list(signed.values())
    r1 = identity.verify_roster(items, job_id="job-1", own=signed["b"])
    r2 = identity.verify_roster(items[::-1], job_id="job-1", own=signed["c"])
    assert r1.party_ids == ("a", "b", "c")
    assert r1.session_id == r2.session_id and len(r1.session_id) == 32


def test_roster_session_id_changes_with_fresh_keys(keys, signed):
    r1 = identity.verify_roster(signed.values(), job_id="job-1", own=signed["a"])
    fresh = dict(signed, c=identity.sign_bundle(keys["c"], bundle_for(keys["c"], "c")))
    r2 = identity.verify_roster(fresh.values(), job_id="job-1", own=fresh["a"])
    assert r1.session_id != r2.session_id


def test_roster_with_our_entry_replaced_is_refused(keys, signed):
    # The coordinator swaps our X25519 key for one it made (re-signed would need our identity key).
    ours = signed["a"]
    forged = identity.sign_bundle(keys["a"], bundle_for(keys["a"], "a"))  # a different, validly signed bundle
    with pytest.raises(InvalidSignature, match="own key bundle"):
        identity.verify_roster([forged, signed["b"], signed["c"]], job_id="job-1", own=ours)
    with pytest.raises(InvalidSignature, match="own key bundle"):
        identity.verify_roster([signed["b"], signed["c"]], job_id="job-1", own=ours)


def test_roster_with_a_tampered_peer_is_refused(signed):
    b = KeyBundle.from_bytes(signed["b"].bundle)
    swapped = replace(b, x25519_public=secrets.token_bytes(32)).canonical_bytes()
    with pytest.raises(InvalidSignature, match="'b'"):
        identity.verify_roster([signed["a"], SignedBundle(swapped, signed["b"].signature), signed["c"]],
                               job_id="job-1", own=signed["a"])


def test_roster_refuses_duplicates_other_jobs_and_unpinned_parties(keys, signed):
    with pytest.raises(InvalidSignature, match="twice"):
        identity.verify_roster([signed["a"], signed["b"], signed["b"]], job_id="job-1", own=signed["a"])
    other_job = identity.sign_bundle(keys["c"], bundle_for(keys["c"], "c", job="job-2"))
    with pytest.raises(InvalidSignature, match="job-2"):
        identity.verify_roster([signed["a"], signed["b"], other_job], job_id="job-1", own=signed["a"])
    pinned = {p: identity.public_bytes(keys[p]) for p in ("a", "b")}
    with pytest.raises(InvalidSignature, match="pinned"):
        identity.verify_roster(signed.values(), job_id="job-1", own=signed["a"], allowed=pinned)


@pytest.mark.parametrize("party", ["", "-a", "a b", "a/b", "x" * 65, "é"])
def test_bad_party_ids_are_refused(party):
    with pytest.raises(InvalidInput, match="party id"):
        identity.check_party_id(party)


def test_crypto_takes_bytes_and_opens_no_files() -> None:
    """STYLE 10: like pyca/cryptography, xclp.crypto never opens a file; the CLIs and the runtime do."""
    from pathlib import Path

    for module in sorted((Path(__file__).resolve().parents[2] / "crypto").rglob("*.py")):
        text = module.read_text()
        for needle in ("open(", "read_bytes(", "write_bytes(", "read_text(", "write_text(", "read_toml("):
            assert needle not in text, f"{module.name} calls {needle}"
