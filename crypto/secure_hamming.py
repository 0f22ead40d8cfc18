"""Packed Paillier SecureHamming: A's bit slices, B's masked evaluation, A's CRT decryption (DESIGN §5.3).

Paper 003 §3 ("PHE-based secure Hamming distance") encrypts every bit and returns one ciphertext
per pair; `crypto/literal_hamming.py` keeps that as oracle and baseline. Here, following DESIGN
§5.3, A packs bit l of K of its vectors into one plaintext of K slots of w bits, and B turns the
identity h(x, y) = |x| + Σ_l (1 − 2x_l)·y_l into one ciphertext per (x, batch):

    D = Π_l C_{g,l}^(1−2x_l) · Enc_A(Σ_s (|x|·[s real] + r_s)·2^(ws))

with r_s uniform in [0, 2^(w−1)) from `secrets`, so A decrypts slot values t = h + r that hide h
statistically (r is σ bits wider than h) and the coordinator computes H = t − r.

Roles and their calls:
  A: `encrypt_bit_slices` → send `EncryptedSlices.to_bytes()` to B;
  B: `evaluate` → send `EvaluatedDistances.to_bytes()` to A and the masks to the coordinator;
  A: `decrypt_and_unpack` → send t to the coordinator;  coordinator: `unmask_distances`.

Speed (DESIGN §5.3): A encrypts with its secret key (CRT + fixed-base tables, crypto/paillier.py).
B uses Π_l C_l^(1−2x_l) = (Π_l C_l)·Π_{x_l=1} C_l^(−2): the inverses C_l^(−2) come from one
batch (Montgomery) inversion per batch, and the x-dependent product is read from "four Russians"
subset tables over groups of `group_bits` consecutive bits (one multiplication per group and
vector; see `choose_group_bits`), with Π_l C_l folded into the first table. Work is chunked by
batch over a process pool; tasks ship bytes, and tables live in a per-process cache.

Cost per ciphertext D (|N| = 2048, L = 1024, n_B = 1000, g = 8): B does ⌈L/g⌉ − 1 = 127 table
products, 45 fixed-base products for the fresh factor, 2 more, and ~33 table-building products
amortised over its vectors — ≈ 207 products mod N² (~4.5–6 µs each with gmpy2 here), against
two 1024-bit-exponent powmods mod p², q² for A's decryption (~2.6 ms). B's part is thus ~40 % of
the decryption floor and A's encryption (two 45-product fixed-base powers mod p², q² per bit
slice, ⌈n_A/K⌉·L of them) another ~8 %.
"""

from __future__ import annotations

import secrets
import struct
from concurrent.futures import Executor
from dataclasses import dataclass
from functools import lru_cache

import gmpy2
import numpy as np
from gmpy2 import mpz

from crypto.paillier import (
    DEFAULT_WINDOW,
    FixedBaseTable,
    PaillierKeypair,
    PaillierPublicKey,
    SecretKeyEncryptor,
    ciphertexts_to_bytes,
    parse_ciphertexts,
)
from crypto.pool import run_tasks
from xclp.errors import InvalidInput, OutOfRange, ProtocolError

DEFAULT_SIGMA = 40


@dataclass(frozen=True)
class SlotLayout:
    """Slot packing for a modulus of `n_bits` bits and codes of L bits (DESIGN §5.3).

    w = ⌈log2(L+1)⌉ + σ + 1 holds h + r < L + 2^(w−1) < 2^w; K = ⌊(|N| − 2)/w⌋ slots keep the
    packed plaintext below 2^(|N|−2) < N, so Paillier's arithmetic mod N never wraps.
    """

    n_bits: int
    L: int
    sigma: int = DEFAULT_SIGMA

    def __post_init__(self) -> None:
        if self.L < 1 or self.L > 0xFFFF:
            raise InvalidInput(f"code length L must be in [1, 65535] (distances travel as uint16), got {self.L}")
        if self.sigma < 1:
            raise InvalidInput(f"statistical security sigma must be >= 1 bit, got {self.sigma}")
        if self.width > 64:
            raise InvalidInput(f"slot width {self.width} > 64 bits: lower sigma or L (masks are uint64)")
        if self.slots < 1:
            raise InvalidInput(f"a {self.n_bits}-bit modulus cannot hold one {self.width}-bit slot")

    @classmethod
    def for_key(cls, public: PaillierPublicKey, L: int, sigma: int = DEFAULT_SIGMA) -> SlotLayout:
        return cls(public.n_bits, L, sigma)

    @property
    def width(self) -> int:
        """w, bits per slot."""
        return (self.L).bit_length() + self.sigma + 1  # bit_length(L) == ⌈log2(L+1)⌉

    @property
    def slots(self) -> int:
        """K, slots per plaintext."""
        return (self.n_bits - 2) // self.width

    @property
    def mask_bits(self) -> int:
        """Masks r are uniform in [0, 2^mask_bits), mask_bits = w − 1 = ⌈log2(L+1)⌉ + σ."""
        return self.width - 1

    def batches(self, n: int) -> int:
        return -(-n // self.slots)


_SLICES_HEADER = struct.Struct(">8sIIII")  # magic, |N|, L, sigma, n_A
_EVALUATED_HEADER = struct.Struct(">8sIIIII")  # magic, |N|, L, sigma, n_A, n_B


@dataclass(frozen=True)
class EncryptedSlices:
    """A → B: ⌈n_A/K⌉·L ciphertexts C_{g,l}, batch-major, fixed-width bytes."""

    layout: SlotLayout
    n_A: int
    ciphertexts: bytes

    def __post_init__(self) -> None:
        expected = self.layout.batches(self.n_A) * self.layout.L * 2 * self.layout.n_bits // 8
        if self.n_A < 1 or len(self.ciphertexts) != expected:
            raise ProtocolError(f"bit slices for n_A={self.n_A} need {expected} ciphertext bytes, got {len(self.ciphertexts)}")

    def batch(self, g: int) -> bytes:
        size = self.layout.L * 2 * self.layout.n_bits // 8
        return self.ciphertexts[g * size : (g + 1) * size]

    def to_bytes(self) -> bytes:
        lay = self.layout
        return _SLICES_HEADER.pack(b"XCLPSL01", lay.n_bits, lay.L, lay.sigma, self.n_A) + self.ciphertexts

    @classmethod
    def from_bytes(cls, data: bytes) -> EncryptedSlices:
        if len(data) < _SLICES_HEADER.size or data[:8] != b"XCLPSL01":
            raise ProtocolError("not an EncryptedSlices message (bad header)")
        _, n_bits, L, sigma, n_A = _SLICES_HEADER.unpack_from(data)
        try:
            layout = SlotLayout(n_bits, L, sigma)
        except InvalidInput as exc:
            raise ProtocolError(f"bad slot layout in EncryptedSlices: {exc}") from None
        return cls(layout, n_A, data[_SLICES_HEADER.size :])


@dataclass(frozen=True)
class EvaluatedDistances:
    """B → A: one ciphertext D per (batch g, B's vector x), batch-major (index g·n_B + x)."""

    layout: SlotLayout
    n_A: int
    n_B: int
    ciphertexts: bytes

    def __post_init__(self) -> None:
        expected = self.layout.batches(self.n_A) * self.n_B * 2 * self.layout.n_bits // 8
        if self.n_A < 1 or self.n_B < 1 or len(self.ciphertexts) != expected:
            raise ProtocolError(
                f"evaluated distances for n_A={self.n_A}, n_B={self.n_B} need {expected} bytes, got {len(self.ciphertexts)}"
            )

    def batch(self, g: int) -> bytes:
        size = self.n_B * 2 * self.layout.n_bits // 8
        return self.ciphertexts[g * size : (g + 1) * size]

    def to_bytes(self) -> bytes:
        lay = self.layout
        return _EVALUATED_HEADER.pack(b"XCLPED01", lay.n_bits, lay.L, lay.sigma, self.n_A, self.n_B) + self.ciphertexts

    @classmethod
    def from_bytes(cls, data: bytes) -> EvaluatedDistances:
        if len(data) < _EVALUATED_HEADER.size or data[:8] != b"XCLPED01":
            raise ProtocolError("not an EvaluatedDistances message (bad header)")
        _, n_bits, L, sigma, n_A, n_B = _EVALUATED_HEADER.unpack_from(data)
        try:
            layout = SlotLayout(n_bits, L, sigma)
        except InvalidInput as exc:
            raise ProtocolError(f"bad slot layout in EvaluatedDistances: {exc}") from None
        return cls(layout, n_A, n_B, data[_EVALUATED_HEADER.size :])


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


def _unpack_slots(plaintexts: list[mpz], layout: SlotLayout, n_bytes: int) -> np.ndarray:
    """Packed plaintexts → uint64[count, K]; OutOfRange if bits above slot K−1 are set."""
    w, k = layout.width, layout.slots
    raw = np.frombuffer(b"".join(int(m).to_bytes(n_bytes, "little") for m in plaintexts), dtype=np.uint8)
    bits = np.unpackbits(raw.reshape(len(plaintexts), n_bytes), axis=1, bitorder="little")
    if bits[:, k * w :].any():
        raise OutOfRange("a decrypted plaintext has bits above its last slot: B's evaluation is malformed")
    weights = np.uint64(1) << np.arange(w, dtype=np.uint64)
    return bits[:, : k * w].reshape(len(plaintexts), k, w).astype(np.uint64) @ weights


def _slice_plaintexts(bits: np.ndarray, layout: SlotLayout) -> list[int]:
    """uint8[k_b, L] bits of one batch → L plaintexts P_l = Σ_s b_{s,l}·2^(w·s) (DESIGN §5.3)."""
    k_b, L = bits.shape
    slots = np.zeros((L, layout.slots), dtype=np.uint64)
    slots[:, :k_b] = bits.T
    return _pack_slots(slots, layout.width)


# ---- role A: encrypt -----------------------------------------------------------------------------


# Per-process caches: a worker builds each key's fixed-base tables once, on its first task. The
# secret key reaches A's workers as ints over the pool's local pipes (same host, same user).
@lru_cache(maxsize=2)
def _keypair(p: int, q: int, h_s: int, exponent_bits: int) -> PaillierKeypair:
    return PaillierKeypair(PaillierPublicKey(p * q, h_s, exponent_bits), p, q)


@lru_cache(maxsize=2)
def _secret_encryptor(p: int, q: int, h_s: int, exponent_bits: int, window: int) -> SecretKeyEncryptor:
    return _keypair(p, q, h_s, exponent_bits).secret_encryptor(window)


@lru_cache(maxsize=2)
def _public_table(n: int, h_s: int, exponent_bits: int, window: int) -> FixedBaseTable:
    return PaillierPublicKey(n, h_s, exponent_bits).randomness_table(window)


def _secret_state(keypair: PaillierKeypair) -> tuple[int, int, int, int]:
    return int(keypair.p), int(keypair.q), int(keypair.public.h_s), keypair.public.exponent_bits


def _encrypt_batch(secret: tuple[int, int, int, int], window: int, bits: bytes, k_b: int, layout: SlotLayout) -> bytes:
    encryptor = _secret_encryptor(*secret, window)
    batch = np.frombuffer(bits, dtype=np.uint8).reshape(k_b, layout.L)
    cts = encryptor.encrypt_many(_slice_plaintexts(batch, layout))
    return ciphertexts_to_bytes(cts, encryptor.keypair.public)


def encrypt_bit_slices(
    keypair: PaillierKeypair,
    codes: np.ndarray,
    layout: SlotLayout,
    executor: Executor | None = None,
    *,
    window: int = DEFAULT_WINDOW,
) -> EncryptedSlices:
    """Role A: encrypt bit slices of uint64[n_A, ⌈L/64⌉] codes, K vectors per plaintext."""
    if layout.n_bits != keypair.public.n_bits:
        raise InvalidInput(f"layout is for a {layout.n_bits}-bit modulus, key has {keypair.public.n_bits} bits")
    bits = code_bits(codes, layout.L)
    k = layout.slots
    tasks = [
        (_secret_state(keypair), window, bits[g * k : (g + 1) * k].tobytes(), len(bits[g * k : (g + 1) * k]), layout)
        for g in range(layout.batches(len(bits)))
    ]
    return EncryptedSlices(layout, len(bits), b"".join(run_tasks(_encrypt_batch, tasks, executor)))


# ---- role B: evaluate ----------------------------------------------------------------------------


def choose_group_bits(L: int, n_B: int, max_bits: int = 12) -> int:
    """Group size g minimising B's multiplications per batch.

    Tables cost 2^g − 1 products per group and each of B's n_B vectors one product per further
    group, so cost(g) ≈ ⌈L/g⌉·(2^g + n_B): g ≈ log2(n_B) − log2 log2(n_B) (g = 8 for n_B = 1000).
    """
    def cost(g: int) -> int:
        groups = -(-L // g)
        sizes = [min(g, L - i * g) for i in range(groups)]
        return sum((1 << s) - 1 for s in sizes) + n_B * groups

    return min(range(1, min(max_bits, L) + 1), key=cost)


def _batch_invert(values: list[mpz], modulus: mpz) -> list[mpz]:
    """Montgomery's trick: all inverses for one inversion and 3(n−1) products."""
    prefix = [values[0]]
    for v in values[1:]:
        prefix.append(gmpy2.t_mod(prefix[-1] * v, modulus))
    try:
        inv = gmpy2.invert(prefix[-1], modulus)
    except ZeroDivisionError:
        raise ProtocolError("a ciphertext is not invertible mod N² (shares a factor with N)") from None
    out = [mpz(0)] * len(values)
    for i in range(len(values) - 1, 0, -1):
        out[i] = gmpy2.t_mod(inv * prefix[i - 1], modulus)
        inv = gmpy2.t_mod(inv * values[i], modulus)
    out[0] = inv
    return out


def _subset_tables(factors: list[mpz], group_bits: int, first: mpz, modulus: mpz) -> list[list[mpz]]:
    """Table i maps a g-bit pattern to Π_{j in pattern} factors[i·g + j]; table 0 also times `first`."""
    tables = []
    for start in range(0, len(factors), group_bits):
        group = factors[start : start + group_bits]
        table = [first if start == 0 else mpz(1)] * (1 << len(group))
        for mask in range(1, len(table)):
            low = mask & -mask
            rest, factor = mask ^ low, group[low.bit_length() - 1]
            table[mask] = factor if (rest == 0 and start > 0) else gmpy2.t_mod(table[rest] * factor, modulus)
        tables.append(table)
    return tables


def _evaluate_batch(
    public: tuple[int, int, int], window: int, slices: bytes, patterns: np.ndarray, group_bits: int,
    slot_values: np.ndarray, layout: SlotLayout,
) -> bytes:
    """D_x = Π_l C_l · Π_{x_l=1} C_l^(−2) · (1 + M_x·N) · h_s^a for every x (DESIGN §5.3)."""
    n, h_s, exponent_bits = public
    pub = PaillierPublicKey(n, h_s, exponent_bits)
    table = _public_table(n, h_s, exponent_bits, window)
    n2 = pub.nsquare
    t_mod = gmpy2.t_mod
    cts = parse_ciphertexts(slices, pub, count=layout.L, check_units=False)  # inversion checks units
    total = cts[0]
    for c in cts[1:]:
        total = t_mod(total * c, n2)
    inv_sq = [t_mod(c * c, n2) for c in _batch_invert(cts, n2)]
    tables = _subset_tables(inv_sq, group_bits, total, n2)
    masked = _pack_slots(slot_values, layout.width)
    out = []
    for row, m, digits in zip(patterns.tolist(), masked, table.random_digits(len(masked))):
        acc = tables[0][row[0]]
        for t, d in zip(tables[1:], row[1:]):
            if d:
                acc = t_mod(acc * t[d], n2)
        # The fresh randomised encryption is mandatory: without it D carries only A's own
        # randomness and A could test guesses of x (DESIGN §5.3).
        fresh = t_mod((1 + mpz(m) * pub.n) * table.power_digits(digits), n2)
        out.append(t_mod(acc * fresh, n2))
    return ciphertexts_to_bytes(out, pub)


def draw_masks(shape: tuple[int, ...], bits: int) -> np.ndarray:
    """uint64 masks uniform in [0, 2^bits) from the OS CSPRNG (`secrets`); numpy only reshapes."""
    count = int(np.prod(shape))
    words = np.frombuffer(secrets.token_bytes(8 * count), dtype="<u8").astype(np.uint64)
    return (words & np.uint64((1 << bits) - 1)).reshape(shape)


def evaluate(
    public: PaillierPublicKey,
    slices: EncryptedSlices,
    codes_B: np.ndarray,
    executor: Executor | None = None,
    *,
    group_bits: int | None = None,
    window: int = DEFAULT_WINDOW,
) -> tuple[EvaluatedDistances, np.ndarray]:
    """Role B: masked encrypted distances to all of A's vectors, and masks uint64[n_B, n_A].

    The masks go to the coordinator, the EvaluatedDistances to A. Padding slots of A's last
    batch also get uniform masks and no |x| term, so A's view of them is independent of x.
    """
    layout = slices.layout
    if layout.n_bits != public.n_bits:
        raise ProtocolError(f"bit slices are for a {layout.n_bits}-bit modulus, A's key has {public.n_bits} bits")
    bits = code_bits(codes_B, layout.L, "codes_B")
    n_B, k, n_A = len(bits), layout.slots, slices.n_A
    g_bits = group_bits if group_bits is not None else choose_group_bits(layout.L, n_B)
    if not 1 <= g_bits <= 16:
        raise InvalidInput(f"group_bits must be in [1, 16], got {g_bits}")
    groups = -(-layout.L // g_bits)
    padded = np.zeros((n_B, groups * g_bits), dtype=np.int64)
    padded[:, : layout.L] = bits
    # uint16[n_B, groups]: x's bit pattern in each group, the index into that group's table
    patterns = (padded.reshape(n_B, groups, g_bits) @ (np.int64(1) << np.arange(g_bits, dtype=np.int64))).astype(np.uint16)
    weights = bits.sum(axis=1, dtype=np.uint64)
    n_batches = layout.batches(n_A)
    masks = draw_masks((n_batches, n_B, k), layout.mask_bits)
    real = (np.arange(n_batches * k) < n_A).reshape(n_batches, k).astype(np.uint64)
    state = (int(public.n), int(public.h_s), public.exponent_bits)
    tasks = [
        (state, window, slices.batch(g), patterns, g_bits, masks[g] + weights[:, None] * real[g][None, :], layout)
        for g in range(n_batches)
    ]
    out = b"".join(run_tasks(_evaluate_batch, tasks, executor))
    r = masks.transpose(1, 0, 2).reshape(n_B, n_batches * k)[:, :n_A]
    return EvaluatedDistances(layout, n_A, n_B, out), np.ascontiguousarray(r)


# ---- role A: decrypt; coordinator: unmask --------------------------------------------------------


def _decrypt_chunk(secret: tuple[int, int, int, int], data: bytes) -> list[mpz]:
    keypair = _keypair(*secret)
    return [keypair.decrypt(c) for c in parse_ciphertexts(data, keypair.public)]


def _decrypt_batch(secret: tuple[int, int, int, int], data: bytes, layout: SlotLayout) -> np.ndarray:
    """uint64[count, K] slot values of one batch's ciphertexts."""
    return _unpack_slots(_decrypt_chunk(secret, data), layout, layout.n_bits // 8)


def decrypt_and_unpack(
    keypair: PaillierKeypair,
    evaluated: EvaluatedDistances,
    layout: SlotLayout,
    n_A: int,
    executor: Executor | None = None,
) -> np.ndarray:
    """Role A: CRT-decrypt B's ciphertexts and unpack slot values t: uint64[n_B, n_A]."""
    if evaluated.layout != layout or evaluated.n_A != n_A:
        raise ProtocolError(f"B evaluated {evaluated.layout}, n_A={evaluated.n_A}; expected {layout}, n_A={n_A}")
    if layout.n_bits != keypair.public.n_bits:
        raise InvalidInput(f"layout is for a {layout.n_bits}-bit modulus, key has {keypair.public.n_bits} bits")
    tasks = [(_secret_state(keypair), evaluated.batch(g), layout) for g in range(layout.batches(n_A))]
    slots = np.concatenate(run_tasks(_decrypt_batch, tasks, executor), axis=0)  # [(g, x), K]
    n_batches, k = layout.batches(n_A), layout.slots
    t = slots.reshape(n_batches, evaluated.n_B, k).transpose(1, 0, 2).reshape(evaluated.n_B, n_batches * k)
    return np.ascontiguousarray(t[:, :n_A])


def decrypt_all(keypair: PaillierKeypair, data: bytes, tasks: int, executor: Executor | None = None) -> list[mpz]:
    """CRT decryption alone of concatenated ciphertexts in `tasks` chunks (the benchmark's floor)."""
    width = keypair.public.ciphertext_bytes
    count = len(data) // width
    bounds = np.linspace(0, count, tasks + 1).astype(int)
    chunks = [(_secret_state(keypair), data[a * width : b * width]) for a, b in zip(bounds[:-1], bounds[1:])]
    return [m for part in run_tasks(_decrypt_chunk, chunks, executor) for m in part]


def unmask_distances(t: np.ndarray, r: np.ndarray, L: int) -> np.ndarray:
    """Coordinator: H = t − r as uint16[n_B, n_A]; OutOfRange unless every value is in [0, L]."""
    t_arr, r_arr = np.asarray(t), np.asarray(r)
    if t_arr.shape != r_arr.shape or t_arr.ndim != 2:
        raise OutOfRange(f"slot values {t_arr.shape} and masks {r_arr.shape} must be 2-D arrays of one shape")
    if t_arr.dtype != np.uint64 or r_arr.dtype != np.uint64:
        raise OutOfRange(f"slot values and masks must be uint64, got {t_arr.dtype} and {r_arr.dtype}")
    if not 1 <= L <= 0xFFFF:
        raise InvalidInput(f"L must be in [1, 65535], got {L}")
    h = t_arr - r_arr  # wraps where t < r; caught below
    bad = (t_arr < r_arr) | (h > np.uint64(L))
    if bad.any():
        i, j = (int(v) for v in np.argwhere(bad)[0])
        raise OutOfRange(f"{int(bad.sum())} unmasked distances lie outside [0, {L}] (first at [{i}, {j}])")
    return h.astype(np.uint16)
