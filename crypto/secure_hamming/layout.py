"""SecureHamming's slot layout and wire formats (docs/design.md §5.3): what A, B and the coordinator agree on.

`SlotLayout` fixes w and K from |N| and L; `EncryptedSlices` (A → B), `EvaluatedDistances`
(B → A) and `Residues` (t and R, to the coordinator) are the three messages, each parsed from
untrusted bytes with its size checked; `code_bits` and the slot packing turn packed LSH codes into
plaintexts. See docs/secure_hamming.md for the protocol and why it is exact.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np
from gmpy2 import mpz

from xclp.crypto.paillier import PaillierPublicKey
from xclp.errors import InvalidInput, ProtocolError


@dataclass(frozen=True)
class SlotLayout:
    """Slot packing for a modulus of `modulus_bits` bits and codes of L bits (module docstring).

    w = ⌈log2(L+1)⌉ holds any h in [0, L]; K = ⌊(|N| − 2)/w⌋ slots keep the packed plaintext
    below 2^(|N|−2) < N, so (t − R) mod N is the packed H itself. The masks R are uniform mod N
    and need no room in the slots.
    """

    modulus_bits: int
    L: int

    def __post_init__(self) -> None:
        if self.L < 1 or self.L > 0xFFFF:
            raise InvalidInput(f"code length L must be in [1, 65535] (distances travel as uint16), got {self.L}")
        if self.modulus_bits < 16 or self.modulus_bits % 8:
            raise InvalidInput(f"modulus size must be a whole number of bytes >= 16 bits, got {self.modulus_bits}")
        if self.slots < 1:
            raise InvalidInput(f"a {self.modulus_bits}-bit modulus cannot hold one {self.width}-bit slot")

    @classmethod
    def for_key(cls, public: PaillierPublicKey, L: int) -> SlotLayout:
        return cls(public.modulus_bits, L)

    @property
    def width(self) -> int:
        """w, bits per slot: ⌈log2(L+1)⌉ (== L.bit_length())."""
        return self.L.bit_length()

    @property
    def slots(self) -> int:
        """K, slots per plaintext."""
        return (self.modulus_bits - 2) // self.width

    @property
    def value_bytes(self) -> int:
        """Fixed width of one t or R on the wire: |N|/8 bytes."""
        return self.modulus_bits // 8

    def batches(self, n: int) -> int:
        return -(-n // self.slots)

    @property
    def ciphertext_bytes(self) -> int:
        """One Paillier ciphertext mod N² on the wire: 2|N|/8 bytes."""
        return 2 * self.value_bytes

    def slices_bytes(self, n_A: int) -> int:
        """A's encrypted bit slices of n_A vectors: ⌈n_A/K⌉·L ciphertexts."""
        return self.batches(n_A) * self.L * self.ciphertext_bytes

    def values(self, n_A: int, n_B: int) -> int:
        """How many ciphertexts D (and so values t and masks R) a pair produces: ⌈n_A/K⌉·n_B."""
        return self.batches(n_A) * n_B


_SLICES_HEADER = struct.Struct(">8sIII")  # magic, |N|, L, n_A
_EVALUATED_HEADER = struct.Struct(">8sIIII")  # magic, |N|, L, n_A, n_B
_SLICES_MAGIC = b"XCLPSL02"  # 02: whole-plaintext masks (01 had per-slot σ-bit masks)
_EVALUATED_MAGIC = b"XCLPED02"


def _parse_layout(modulus_bits: int, L: int, what: str) -> SlotLayout:
    try:
        return SlotLayout(modulus_bits, L)
    except InvalidInput as exc:
        raise ProtocolError(f"bad slot layout in {what}: {exc}") from None


@dataclass(frozen=True)
class EncryptedSlices:
    """A → B: ⌈n_A/K⌉·L ciphertexts C_{g,l}, batch-major, fixed-width bytes."""

    layout: SlotLayout
    n_A: int
    ciphertexts: bytes

    def __post_init__(self) -> None:
        expected = self.layout.slices_bytes(self.n_A)
        if self.n_A < 1 or len(self.ciphertexts) != expected:
            raise ProtocolError(f"bit slices for n_A={self.n_A} need {expected} ciphertext bytes, got "
                                f"{len(self.ciphertexts)}")

    def batch(self, g: int) -> bytes:
        size = self.layout.L * self.layout.ciphertext_bytes
        return self.ciphertexts[g * size : (g + 1) * size]

    def to_bytes(self) -> bytes:
        lay = self.layout
        return _SLICES_HEADER.pack(_SLICES_MAGIC, lay.modulus_bits, lay.L, self.n_A) + self.ciphertexts

    @classmethod
    def from_bytes(cls, data: bytes) -> EncryptedSlices:
        if len(data) < _SLICES_HEADER.size or data[:8] != _SLICES_MAGIC:
            raise ProtocolError("not an EncryptedSlices message (bad header)")
        _, modulus_bits, L, n_A = _SLICES_HEADER.unpack_from(data)
        return cls(_parse_layout(modulus_bits, L, "EncryptedSlices"), n_A, data[_SLICES_HEADER.size :])


@dataclass(frozen=True)
class EvaluatedDistances:
    """B → A: one ciphertext D per (batch g, B's vector x), batch-major (index g·n_B + x)."""

    layout: SlotLayout
    n_A: int
    n_B: int
    ciphertexts: bytes

    def __post_init__(self) -> None:
        expected = self.layout.values(self.n_A, self.n_B) * 2 * self.layout.value_bytes
        if self.n_A < 1 or self.n_B < 1 or len(self.ciphertexts) != expected:
            raise ProtocolError(
                f"evaluated distances for n_A={self.n_A}, n_B={self.n_B} need {expected} bytes, got "
                f"{len(self.ciphertexts)}"
            )

    def batch(self, g: int) -> bytes:
        size = self.n_B * 2 * self.layout.value_bytes
        return self.ciphertexts[g * size : (g + 1) * size]

    def to_bytes(self) -> bytes:
        lay = self.layout
        return _EVALUATED_HEADER.pack(_EVALUATED_MAGIC, lay.modulus_bits, lay.L, self.n_A, self.n_B) + self.ciphertexts

    @classmethod
    def from_bytes(cls, data: bytes) -> EvaluatedDistances:
        if len(data) < _EVALUATED_HEADER.size or data[:8] != _EVALUATED_MAGIC:
            raise ProtocolError("not an EvaluatedDistances message (bad header)")
        _, modulus_bits, L, n_A, n_B = _EVALUATED_HEADER.unpack_from(data)
        return cls(_parse_layout(modulus_bits, L, "EvaluatedDistances"), n_A, n_B, data[_EVALUATED_HEADER.size :])


@dataclass(frozen=True)
class Residues:
    """Values in [0, 2^modulus_bits) — B's masks R or A's decryptions t — as fixed-width big-endian bytes.

    One value per ciphertext D, in D's batch-major order (index g·n_B + x), modulus_bits/8 bytes each,
    concatenated. On the wire they travel as `to_array()`, uint8[count, modulus_bits/8]. Whether a
    value is below the modulus N is checked where N is known (`unmask_distances`).
    """

    modulus_bits: int
    data: bytes

    def __post_init__(self) -> None:
        if self.modulus_bits < 16 or self.modulus_bits % 8:
            raise InvalidInput(f"residues need a whole number of bytes >= 16 bits, got {self.modulus_bits}")
        if len(self.data) % (self.modulus_bits // 8):
            raise ProtocolError(f"{len(self.data)} bytes are not a whole number of {self.modulus_bits // 8}-byte "
                                "values")

    @property
    def width(self) -> int:
        return self.modulus_bits // 8

    @property
    def count(self) -> int:
        return len(self.data) // self.width

    @classmethod
    def from_ints(cls, values: list[int] | list[mpz], modulus_bits: int) -> Residues:
        width = modulus_bits // 8
        try:
            return cls(modulus_bits, b"".join(int(v).to_bytes(width, "big") for v in values))
        except OverflowError:
            raise InvalidInput(f"a residue is negative or does not fit {modulus_bits} bits") from None

    def to_ints(self) -> list[int]:
        w = self.width
        return [int.from_bytes(self.data[i : i + w], "big") for i in range(0, len(self.data), w)]

    def to_array(self) -> np.ndarray:
        """uint8[count, modulus_bits/8], a wire dtype (xclp.v1.wire.ARRAY_DTYPES)."""
        return np.frombuffer(self.data, dtype=np.uint8).reshape(self.count, self.width).copy()

    @classmethod
    def from_array(cls, arr: object, modulus_bits: int, count: int, what: str = "residues") -> Residues:
        """From untrusted uint8[count, modulus_bits/8]; InvalidInput naming what differs."""
        shape = (count, modulus_bits // 8)
        if not isinstance(arr, np.ndarray) or arr.dtype != np.uint8 or arr.shape != shape:
            got = f"{arr.dtype}{list(arr.shape)}" if isinstance(arr, np.ndarray) else type(arr).__name__
            raise InvalidInput(f"{what} must be uint8{list(shape)} (one {modulus_bits}-bit big-endian value per "
                               f"ciphertext), got {got}")
        return cls(modulus_bits, np.ascontiguousarray(arr).tobytes())


# ---- bit and slot packing (numpy, no per-bit Python loops) -------------------------------------


def code_bits(codes: np.ndarray, L: int, name: str = "codes") -> np.ndarray:
    """uint64[n, ⌈L/64⌉] packed codes (bit l in word l//64 at position l%64) → uint8[n, L] of 0/1."""
    arr = np.asarray(codes)
    if arr.ndim != 2 or arr.dtype != np.uint64:
        raise InvalidInput(f"{name} must be a uint64[n, L/64] array of packed codes, got {arr.dtype} shape {arr.shape}")
    if arr.shape[0] < 1 or arr.shape[1] != -(-L // 64):
        raise InvalidInput(f"{name} has shape {arr.shape}; L={L} bits need {-(-L // 64)} words per row and >= 1 row")
    bits = np.unpackbits(np.ascontiguousarray(arr, dtype="<u8").view(np.uint8), axis=1, bitorder="little")
    if bits[:, L:].any():
        raise InvalidInput(f"{name} has bits set beyond bit L={L}; padding bits must be zero")
    return bits[:, :L]


def _pack_slots(values: np.ndarray, width: int) -> list[int]:
    """uint64[n, K] slot values (< 2^width) → n integers Σ_s values[:, s]·2^(width·s)."""
    n, k = values.shape
    bits = ((values[:, :, None] >> np.arange(width, dtype=np.uint64)) & np.uint64(1)).astype(np.uint8)
    packed = np.packbits(bits.reshape(n, k * width), axis=1, bitorder="little")
    return [int.from_bytes(row.tobytes(), "little") for row in packed]


def slice_plaintexts(bits: np.ndarray, layout: SlotLayout) -> list[int]:
    """uint8[k_b, L] bits of one batch → L plaintexts P_l = Σ_s b_{s,l}·2^(w·s) (docs/design.md §5.3)."""
    k_b, L = bits.shape
    slots = np.zeros((L, layout.slots), dtype=np.uint64)
    slots[:, :k_b] = bits.T
    return _pack_slots(slots, layout.width)
