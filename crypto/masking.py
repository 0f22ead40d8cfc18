"""Pairwise additive masks in Z_{2^32} / Z_{2^64} (docs/design.md §4.2, §5.6, §6).

Party i adds M_i = Σ_{k≠i} ±PRG(key_ik) (+ if i < k in string order, − otherwise) to its array.
Each pair's two terms cancel in the coordinator's sum mod 2^bits, so the coordinator learns the
aggregate only, while each masked array on its own is uniform in the ring.

- Key agreement: X25519 (`cryptography`); the public keys are signed elsewhere (crypto/identity.py).
- Keys: `crypto.kdf.derive_key`, fresh per (purpose, attempt, participant set) (docs/design.md §4.2).
- PRG: AES-256-CTR keystream read little-endian as uint32/uint64 (docs/design.md §5.6).
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import numpy as np
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, CipherContext, algorithms, modes

from xclp.crypto.kdf import derive_key, key_info
from xclp.errors import InvalidInput, ProtocolError, ReplayRefused

X25519_KEY_BYTES = 32
AES_KEY_BYTES = 32
AES_BLOCK_BYTES = 16
ZERO_COUNTER = bytes(AES_BLOCK_BYTES)
RING_DTYPES = (np.dtype(np.uint32), np.dtype(np.uint64))
# Keystream is produced and added in chunks of this many bytes, so the keystream of every peer and
# the output block stay in cache while they are summed (measured in benchmarks/masking.py).
_CHUNK_BYTES = 1 << 17
# The keystream is defined as little-endian words; on a big-endian host the words are swapped.
_SWAP_WORDS = sys.byteorder != "little"


def generate_x25519() -> X25519PrivateKey:
    """A fresh X25519 key from the OS CSPRNG (docs/design.md §2)."""
    return X25519PrivateKey.generate()


def public_bytes(sk: X25519PrivateKey) -> bytes:
    """The raw 32-byte public key of `sk` (what goes into the signed key bundle)."""
    return sk.public_key().public_bytes_raw()


def shared_secret(sk: X25519PrivateKey, peer_public: bytes) -> bytes:
    """Raw 32-byte X25519 secret with a peer; refuse malformed or low-order peer keys.

    A low-order public key forces the all-zero secret (RFC 7748 §6.1), which would make every
    derived mask public; such a key can only come from a malicious peer, hence ProtocolError.
    """
    if not isinstance(peer_public, (bytes, bytearray)) or len(peer_public) != X25519_KEY_BYTES:
        size = len(peer_public) if isinstance(peer_public, (bytes, bytearray)) else type(peer_public).__name__
        raise ProtocolError(f"peer X25519 public key must be {X25519_KEY_BYTES} bytes, got {size}")
    try:
        secret = sk.exchange(X25519PublicKey.from_public_bytes(bytes(peer_public)))
    except ValueError as exc:  # `cryptography` refuses low-order points itself
        raise ProtocolError(f"X25519 key agreement failed (low-order peer key?): {exc}") from None
    if secret == bytes(X25519_KEY_BYTES):
        raise ProtocolError("X25519 shared secret is all zeros: the peer sent a low-order public key")
    return secret


def keystream(
    key: bytes, count: int, dtype: type[np.unsignedinteger[Any]] | np.dtype[Any], *, counter: bytes = ZERO_COUNTER
) -> np.ndarray:
    """AES-256-CTR keystream read little-endian as `dtype[count]` (uint32 or uint64).

    The initial counter block is zero by default. That is safe because every key is used for
    exactly one keystream: keys are derived per (session, purpose, round, participant set, pair)
    and `PairwiseMasker` refuses to reuse a (purpose, attempt, participant set) (docs/design.md §4.2).
    `counter` exists for published test vectors (NIST SP 800-38A F.5.5).
    """
    dt = _ring_dtype(dtype)
    _check_count(count)
    n_bytes = count * dt.itemsize
    out = np.empty(count, dtype=dt)
    if n_bytes:
        _encryptor(key, counter).update_into(bytes(n_bytes), _byte_buffer(out))
        if _SWAP_WORDS:
            out.byteswap(inplace=True)
    return out


@dataclass(frozen=True)
class PairwiseMasker:
    """One party's pairwise masks for one session (docs/design.md §5.6, §6).

    `secrets` maps peer id -> raw X25519 shared secret (from `shared_secret`). The masker remembers
    every (purpose, attempt, participant set) it has produced a mask for and refuses a second use
    (`ReplayRefused`): publishing two different arrays under the same mask would reveal their
    difference. A restarted step must therefore use a new attempt (docs/design.md §5.6). `mask` and `apply`
    share that ledger: whoever obtains a mask may publish with it, so either call uses the slot up.
    The ledger lives in memory: a party process that restarts mid-session must join a new session.
    """

    my_id: str
    secrets: Mapping[str, bytes]
    session_id: bytes
    _used: set[tuple[str, int, frozenset[str]]] = field(
        default_factory=set, init=False, repr=False, compare=False
    )
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.my_id, str) or not self.my_id:
            raise InvalidInput(f"my_id must be a non-empty string, got {self.my_id!r}")
        if not isinstance(self.session_id, (bytes, bytearray)) or not self.session_id:
            raise InvalidInput("session_id must be non-empty bytes")
        if not isinstance(self.secrets, Mapping):
            raise InvalidInput(f"secrets must map peer id -> shared secret, got {type(self.secrets).__name__}")
        if self.my_id in self.secrets:
            raise InvalidInput(f"secrets must not contain my own id {self.my_id!r}")
        for peer, ss in self.secrets.items():
            if not isinstance(peer, str) or not peer:
                raise InvalidInput(f"peer ids must be non-empty strings, got {peer!r}")
            if not isinstance(ss, (bytes, bytearray)) or len(ss) != X25519_KEY_BYTES:
                raise InvalidInput(f"shared secret with {peer!r} must be {X25519_KEY_BYTES} bytes")
        # Frozen: keep a read-only copy so a caller mutating its dict cannot change our keys.
        object.__setattr__(self, "secrets", MappingProxyType({p: bytes(s) for p, s in self.secrets.items()}))
        object.__setattr__(self, "session_id", bytes(self.session_id))

    def mask(
        self,
        shape: int | tuple[int, ...],
        dtype: type[np.unsignedinteger[Any]] | np.dtype[Any],
        *,
        purpose: str,
        attempt: int,
        participants: Iterable[str],
        transcript: bytes = b"",
    ) -> np.ndarray:
        """M = Σ_{peer in participants, peer ≠ me} ±keystream(key_peer), dtype[shape], mod 2^bits.

        Consumes the (purpose, attempt, participant set) like `apply`.
        """
        dt = _ring_dtype(dtype)
        shape = _check_shape(shape)
        out = np.zeros(shape, dtype=dt)
        self._add_mask_into(out, purpose=purpose, attempt=attempt, participants=participants, transcript=transcript)
        return out

    def apply(self, values: np.ndarray, *, purpose: str, attempt: int, participants: Iterable[str],
              transcript: bytes = b"") -> np.ndarray:
        """values + M mod 2^bits as a new array (same dtype/shape; `values` is never mutated).

        `transcript`: the hash of the public values this party accepted (docs/design.md §2.5), bound into
        every pairwise key, so masks cancel only among parties that saw the same."""
        if not isinstance(values, np.ndarray):
            raise InvalidInput(f"values must be a numpy array, got {type(values).__name__}")
        dt = _ring_dtype(values.dtype)
        out = np.array(values, dtype=dt, order="C", copy=True)
        self._add_mask_into(out, purpose=purpose, attempt=attempt, participants=participants, transcript=transcript)
        return out

    def _add_mask_into(self, out: np.ndarray, *, purpose: str, attempt: int, participants: Iterable[str],
                       transcript: bytes = b"") -> None:
        members = self._check_participants(participants)
        key_info(purpose, attempt, members)  # validates purpose, attempt and uniqueness up front
        slot = (purpose, attempt, frozenset(members))
        encryptors: list[tuple[bool, CipherContext]] = []
        for peer in sorted(members):
            if peer == self.my_id:
                continue
            key = derive_key(self.secrets[peer], session_id=self.session_id, purpose=purpose, attempt=attempt,
                             participants=members, transcript=transcript)
            # docs/design.md §5.6: + if my id sorts before the peer's, − otherwise, so each pair cancels.
            encryptors.append((self.my_id < peer, _encryptor(key, ZERO_COUNTER)))
        with self._lock:  # check-and-record is atomic, so two threads cannot both use a slot
            if slot in self._used:
                raise ReplayRefused(
                    f"masks for purpose {purpose!r}, attempt {attempt} and this participant set were already "
                    "used; a restarted step must use a new attempt"
                )
            self._used.add(slot)
        _accumulate(out, encryptors)

    def _check_participants(self, participants: Iterable[str]) -> list[str]:
        if isinstance(participants, (str, bytes)):
            raise InvalidInput("participants must be a collection of party ids, not a single string")
        members = list(participants)
        if self.my_id not in members:
            raise InvalidInput(f"participants must include my own id {self.my_id!r}")
        unknown = sorted(str(p) for p in set(members) - set(self.secrets) - {self.my_id})
        if unknown:
            raise InvalidInput(f"no shared secret with participant(s) {', '.join(unknown)}")
        return members


def ring_sum(arrays: Iterable[np.ndarray]) -> np.ndarray:
    """Element-wise sum mod 2^bits of uint32/uint64 arrays of one dtype and shape (new array)."""
    total: np.ndarray | None = None
    for i, arr in enumerate(arrays):
        if not isinstance(arr, np.ndarray):
            raise InvalidInput(f"array {i} is a {type(arr).__name__}, not a numpy array")
        _ring_dtype(arr.dtype)
        if total is None:
            total = np.array(arr, copy=True)
            continue
        if arr.dtype != total.dtype or arr.shape != total.shape:
            raise InvalidInput(
                f"array {i} has dtype {arr.dtype} and shape {arr.shape}; expected {total.dtype} {total.shape}"
            )
        np.add(total, arr, out=total)  # unsigned integer addition wraps mod 2^bits
    if total is None:
        raise InvalidInput("ring_sum needs at least one array")
    return total


def _accumulate(out: np.ndarray, encryptors: list[tuple[bool, CipherContext]]) -> None:
    """Add (+) or subtract (−) each encryptor's keystream into C-contiguous `out`, chunk by chunk."""
    if not encryptors or out.size == 0:
        return
    flat = out.reshape(-1)
    step = max(1, _CHUNK_BYTES // out.dtype.itemsize)
    zeros = bytes(step * out.dtype.itemsize)
    scratch = np.empty(step, dtype=out.dtype)
    for start in range(0, flat.size, step):
        block = flat[start : start + step]
        ks = scratch[: block.size]
        for positive, enc in encryptors:
            # CTR encryptors are stateful, so successive chunks continue one keystream.
            enc.update_into(zeros[: ks.nbytes], _byte_buffer(ks))
            if _SWAP_WORDS:
                ks.byteswap(inplace=True)
            (np.add if positive else np.subtract)(block, ks, out=block)


def _encryptor(key: bytes, counter: bytes) -> CipherContext:
    if not isinstance(key, (bytes, bytearray)) or len(key) != AES_KEY_BYTES:
        raise InvalidInput(f"keystream key must be {AES_KEY_BYTES} bytes (AES-256)")
    if not isinstance(counter, (bytes, bytearray)) or len(counter) != AES_BLOCK_BYTES:
        raise InvalidInput(f"initial counter block must be {AES_BLOCK_BYTES} bytes")
    return Cipher(algorithms.AES(bytes(key)), modes.CTR(bytes(counter))).encryptor()


def _byte_buffer(arr: np.ndarray) -> memoryview:
    """A writable byte view of C-contiguous `arr`."""
    return arr.view(np.uint8).reshape(-1).data


def _ring_dtype(dtype: Any) -> np.dtype[Any]:
    try:
        dt = np.dtype(dtype)
    except TypeError:
        raise InvalidInput(f"dtype must be uint32 or uint64, got {dtype!r}") from None
    if dt.newbyteorder("=") not in RING_DTYPES:
        raise InvalidInput(f"ring arrays must be uint32 or uint64, got {dt}")
    if not dt.isnative:
        raise InvalidInput(f"ring arrays must be in native byte order, got {dt}")
    return dt


def _check_count(count: int) -> None:
    if isinstance(count, bool) or not isinstance(count, (int, np.integer)) or count < 0:
        raise InvalidInput(f"count must be an integer >= 0, got {count!r}")


def _check_shape(shape: int | tuple[int, ...]) -> tuple[int, ...]:
    dims = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
    for d in dims:
        if isinstance(d, bool) or not isinstance(d, (int, np.integer)) or d < 0:
            raise InvalidInput(f"shape must be non-negative integers, got {shape!r}")
    return tuple(int(d) for d in dims)
