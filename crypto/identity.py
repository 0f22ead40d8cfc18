"""Long-term Ed25519 identities, signed key bundles and the signed roster (docs/design.md §2, §4.1).

Each party owns an Ed25519 identity key; the coordinator's allow-list names its public key.
For every job a party draws a fresh X25519 key (and, for XCLP, a Paillier key) and signs a
`KeyBundle` binding them to its party id and the job. The roster is the list of signed bundles;
every party verifies every signature and checks that its own entry came back unmodified, so even
an active coordinator cannot substitute key-agreement keys. The session id is the SHA-256 of the
canonical roster: every party derives the same one and a new run (fresh X25519 keys) gets a new one.

Like pyca/cryptography's loaders, everything here takes and gives bytes or parsed values; reading
and writing key files is the CLIs' job (xclp.runtime: `read_bytes`, `write_private`, `read_toml`).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from cryptography.exceptions import InvalidSignature as _CryptoInvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from xclp.errors import ConfigError, InvalidInput, InvalidSignature, ProtocolError

_PARTY_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
# v3: the masked sums share self-mask seeds for recovery, which a v2 party neither
# sends nor answers; v2: the bundle signs the job spec (docs/design.md §2.5)
_BUNDLE_TAG = b"xclp/key-bundle/v3"
_OLD_BUNDLE_TAGS = {b"xclp/key-bundle/v1": "which signs no job spec",
                    b"xclp/key-bundle/v2": "whose masked sums cannot recover a party lost while revealing"}
_SUMMARY = struct.Struct(">QQI")  # rows, labeled rows, dim
_SESSION_TAG = b"xclp/session/v1"
_PUBLIC_PREFIX = "ed25519:"
_MAX_FIELD = 1 << 16


def check_party_id(party_id: str) -> str:
    if not isinstance(party_id, str) or not _PARTY_ID.match(party_id):
        raise InvalidInput(
            f"party id {party_id!r} must be 1-64 characters of letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    return party_id


# --- identity keys -------------------------------------------------------------------------


def generate_identity() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.generate()


def private_key_pem(key: Ed25519PrivateKey) -> bytes:
    """The private key as unencrypted PKCS#8 PEM (the caller writes it owner-only, xclp.runtime.write_private)."""
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def load_private_key(data: bytes, *, source: str = "the key") -> Ed25519PrivateKey:
    """An Ed25519 identity key from unencrypted PEM; ConfigError naming `source` for anything else."""
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"{source} is not an unencrypted PEM private key: {exc}") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise ConfigError(f"{source} holds a {type(key).__name__}, not an Ed25519 identity key")
    return key


def public_bytes(key: Ed25519PrivateKey | Ed25519PublicKey) -> bytes:
    pub = key.public_key() if isinstance(key, Ed25519PrivateKey) else key
    return pub.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def public_key_text(key: Ed25519PrivateKey | Ed25519PublicKey | bytes) -> str:
    """One-line text form for allow-lists: "ed25519:<base64 of the 32 raw bytes>"."""
    raw = key if isinstance(key, bytes) else public_bytes(key)
    return _PUBLIC_PREFIX + base64.b64encode(raw).decode()


def parse_public_key(text: str) -> bytes:
    """The 32 raw bytes of an "ed25519:<base64>" public key; refuses anything else."""
    text = text.strip()
    if not text.startswith(_PUBLIC_PREFIX):
        raise ConfigError(f"public key {text[:20]!r}... must start with {_PUBLIC_PREFIX!r}")
    try:
        raw = base64.b64decode(text[len(_PUBLIC_PREFIX) :], validate=True)
    except binascii.Error:
        raise ConfigError("public key is not valid base64") from None
    if len(raw) != 32:
        raise ConfigError(f"an Ed25519 public key has 32 bytes, got {len(raw)}")
    return raw


def verify_signature(public: bytes, signature: bytes, data: bytes) -> bool:
    """Whether `signature` is an Ed25519 signature of `data` under the 32-byte `public` key."""
    try:
        Ed25519PublicKey.from_public_bytes(public).verify(signature, data)
    except (_CryptoInvalidSignature, ValueError):
        return False
    return True


# --- key bundles -----------------------------------------------------------------------------


@dataclass(frozen=True)
class KeyBundle:
    """What a party publishes for one job, signed by its identity key (docs/design.md §4.1).

    identity_public, x25519_public: 32 raw bytes each. nonce: 16 random bytes (fresh per run).
    paillier_n, paillier_hs: big-endian Paillier modulus N and h_s = h^N mod N² (XCLP only, else b"").
    spec_digest: SHA-256 of the job spec as this party understood it (xclp.v1.spec, docs/design.md §2.5);
    every party refuses a roster whose bundles sign different digests.
    rows, labeled_rows, dim: the party's data summary (docs/design.md §4.1), signed so that every peer
    holds the same row counts (the XCLP layout is checked against them).
    """

    party_id: str
    job_id: str
    identity_public: bytes
    x25519_public: bytes
    nonce: bytes
    paillier_n: bytes = b""
    paillier_hs: bytes = b""
    spec_digest: bytes = b""
    rows: int = 0
    labeled_rows: int = 0
    dim: int = 0

    def __post_init__(self) -> None:
        check_party_id(self.party_id)
        if not self.job_id or len(self.job_id) > 128 or not self.job_id.isprintable():
            raise InvalidInput(f"job id {self.job_id!r} must be 1-128 printable characters")
        for name in ("identity_public", "x25519_public"):
            if not isinstance(getattr(self, name), bytes) or len(getattr(self, name)) != 32:
                raise InvalidInput(f"{name} must be 32 bytes")
        if len(self.nonce) != 16:
            raise InvalidInput("nonce must be 16 bytes")
        if bool(self.paillier_n) != bool(self.paillier_hs):
            raise InvalidInput("paillier_n and paillier_hs come together or not at all")
        if len(self.paillier_n) > _MAX_FIELD or len(self.paillier_hs) > _MAX_FIELD:
            raise InvalidInput("Paillier fields are too large")
        if len(self.spec_digest) not in (0, 32):
            raise InvalidInput("spec_digest must be 32 bytes")
        if not (0 <= self.labeled_rows <= self.rows < 1 << 63 and 0 <= self.dim < 1 << 32):
            raise InvalidInput("the bundle's data summary is out of range")

    def canonical_bytes(self) -> bytes:
        """Tag, then each field as a 4-byte big-endian length and its bytes, in declaration order."""
        fields = (self.party_id.encode(), self.job_id.encode(), self.identity_public, self.x25519_public,
                  self.nonce, self.paillier_n, self.paillier_hs, self.spec_digest,
                  _SUMMARY.pack(self.rows, self.labeled_rows, self.dim))
        return _BUNDLE_TAG + b"".join(struct.pack(">I", len(f)) + f for f in fields)

    @classmethod
    def from_bytes(cls, data: bytes) -> KeyBundle:
        for tag, why in _OLD_BUNDLE_TAGS.items():
            if data.startswith(tag):
                raise InvalidInput(f"the key bundle is of an older xclp ({tag.decode()[5:]}, {why}): "
                                   "upgrade that party")
        if not data.startswith(_BUNDLE_TAG):
            raise InvalidInput("not an xclp key bundle (wrong tag)")
        pos, fields = len(_BUNDLE_TAG), []
        for _ in range(9):
            if pos + 4 > len(data):
                raise InvalidInput("key bundle is truncated")
            (size,) = struct.unpack_from(">I", data, pos)
            pos += 4
            if size > _MAX_FIELD or pos + size > len(data):
                raise InvalidInput("key bundle field runs past its end")
            fields.append(data[pos : pos + size])
            pos += size
        if pos != len(data):
            raise InvalidInput("key bundle has trailing bytes")
        try:
            party_id, job_id = fields[0].decode(), fields[1].decode()
        except UnicodeDecodeError:
            raise InvalidInput("key bundle ids are not UTF-8") from None
        if len(fields[8]) != _SUMMARY.size:
            raise InvalidInput("the key bundle's data summary has the wrong size")
        rows, labeled, dim = _SUMMARY.unpack(fields[8])
        bundle = cls(party_id, job_id, identity_public=fields[2], x25519_public=fields[3], nonce=fields[4],
                     paillier_n=fields[5], paillier_hs=fields[6], spec_digest=fields[7], rows=rows,
                     labeled_rows=labeled, dim=dim)
        if bundle.canonical_bytes() != data:
            raise InvalidInput("key bundle is not in canonical form")
        return bundle


@dataclass(frozen=True)
class SignedBundle:
    bundle: bytes  # KeyBundle.canonical_bytes()
    signature: bytes  # Ed25519, 64 bytes


def sign_bundle(key: Ed25519PrivateKey, bundle: KeyBundle) -> SignedBundle:
    if public_bytes(key) != bundle.identity_public:
        raise InvalidInput("the bundle names another identity key than the one signing it")
    data = bundle.canonical_bytes()
    return SignedBundle(data, key.sign(data))


def verify_bundle(signed: SignedBundle, *, expected_identity: bytes | None = None) -> KeyBundle:
    """The bundle if its signature verifies under the identity key it names (and, if given, that
    key is `expected_identity`, e.g. from the allow-list); raises InvalidSignature otherwise."""
    try:
        bundle = KeyBundle.from_bytes(signed.bundle)
    except InvalidInput as exc:
        raise InvalidSignature(f"malformed key bundle: {exc}") from None
    if expected_identity is not None and bundle.identity_public != expected_identity:
        raise InvalidSignature(f"party {bundle.party_id!r} signed with an identity key other than its allowed one")
    try:
        Ed25519PublicKey.from_public_bytes(bundle.identity_public).verify(signed.signature, signed.bundle)
    except _CryptoInvalidSignature:
        raise InvalidSignature(f"the key bundle of party {bundle.party_id!r} has a bad signature") from None
    return bundle


# --- roster ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Roster:
    """Verified bundles of one job run, sorted by party id, and the session id they define."""

    bundles: tuple[KeyBundle, ...]
    session_id: bytes  # 32 bytes

    @property
    def party_ids(self) -> tuple[str, ...]:
        return tuple(b.party_id for b in self.bundles)

    def bundle(self, party_id: str) -> KeyBundle:
        for b in self.bundles:
            if b.party_id == party_id:
                return b
        raise ProtocolError(f"party {party_id!r} is not on the roster")


def session_id(bundles: Iterable[bytes]) -> bytes:
    """SHA-256 over the canonical bundles in party-id order (callers pass them sorted)."""
    h = hashlib.sha256(_SESSION_TAG)
    for data in bundles:
        h.update(struct.pack(">I", len(data)) + data)
    return h.digest()


def verify_roster(
    signed: Iterable[SignedBundle],
    *,
    job_id: str,
    own: SignedBundle,
    allowed: Mapping[str, bytes] | None = None,
) -> Roster:
    """Check every signature, one bundle per party, all for `job_id`, and our own entry unmodified.

    `allowed` (party id -> identity public key) pins identities when the party knows them.
    """
    items = list(signed)
    bundles: dict[str, tuple[KeyBundle, bytes]] = {}
    for s in items:
        b = verify_bundle(s, expected_identity=None if allowed is None else allowed.get(_peek_id(s)))
        if allowed is not None and b.party_id not in allowed:
            raise InvalidSignature(f"roster names party {b.party_id!r}, which is not in the pinned identities")
        if b.job_id != job_id:
            raise InvalidSignature(f"the bundle of {b.party_id!r} is for job {b.job_id!r}, not {job_id!r}")
        if b.party_id in bundles:
            raise InvalidSignature(f"roster lists party {b.party_id!r} twice")
        bundles[b.party_id] = (b, s.bundle)
    mine = KeyBundle.from_bytes(own.bundle)
    if mine.party_id not in bundles or bundles[mine.party_id][1] != own.bundle:
        raise InvalidSignature(f"our own key bundle ({mine.party_id!r}) is missing from the roster or was modified")
    order = sorted(bundles)
    return Roster(tuple(bundles[p][0] for p in order), session_id(bundles[p][1] for p in order))


def _peek_id(signed: SignedBundle) -> str:
    try:
        return KeyBundle.from_bytes(signed.bundle).party_id
    except InvalidInput as exc:
        raise InvalidSignature(f"malformed key bundle in roster: {exc}") from None


# --- allow-lists (the coordinator's, and each party's pinned copy, docs/design.md §2.1) --------------


def allow_list(table: object, *, source: str = "the allow-list") -> Mapping[str, bytes]:
    """party id -> 32-byte Ed25519 identity public key, from an allow-list's [parties] table (as
    parsed TOML: party id = "ed25519:<base64>").

    The same file serves the coordinator (who may join) and every party (`--peers`: whose keys
    it accepts on a roster), so a coordinator cannot swap a peer's key.
    """
    if not isinstance(table, dict) or not table:
        raise ConfigError(f"{source} needs a non-empty [parties] table mapping party id -> \"ed25519:<base64>\"")
    out: dict[str, bytes] = {}
    for party, key in table.items():
        try:
            check_party_id(party)
        except InvalidInput as exc:
            raise ConfigError(f"{source}: {exc}") from None
        if not isinstance(key, str):
            raise ConfigError(f"{source}: the key of {party!r} must be a string \"ed25519:<base64>\"")
        try:
            out[party] = parse_public_key(key)
        except ConfigError as exc:
            raise ConfigError(f"{source}: party {party!r}: {exc}") from None
    return MappingProxyType(out)
