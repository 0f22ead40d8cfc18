"""SecureHamming role B (docs/design.md §5.3): evaluate masked encrypted distances under A's public key.

For each of its vectors x and each of A's batches, B multiplies A's slice ciphertexts by
"four Russians" subset tables of batch-inverted squares and one fresh randomised encryption of
|x|·Σ 2^(ws) + R, with R uniform mod N (docs/secure_hamming.md). The masks R go to the coordinator.
"""

from __future__ import annotations

import secrets
from concurrent.futures import Executor
from functools import lru_cache

import gmpy2
import numpy as np
from gmpy2 import mpz

from xclp.crypto.paillier import (
    DEFAULT_WINDOW,
    FixedBaseTable,
    PaillierPublicKey,
    ciphertexts_to_bytes,
    parse_ciphertexts,
)
from xclp.crypto.pool import run_tasks
from xclp.crypto.secure_hamming.layout import EncryptedSlices, EvaluatedDistances, Residues, SlotLayout, code_bits
from xclp.errors import InvalidInput, ProtocolError


@lru_cache(maxsize=2)
def _public_table(n: int, h_s: int, exponent_bits: int, window: int) -> FixedBaseTable:
    return PaillierPublicKey(n, h_s, exponent_bits).randomness_table(window)


# ---- evaluate ----------------------------------------------------------------------------


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
    plaintexts: list[int], layout: SlotLayout,
) -> bytes:
    """D_x = Π_l C_l · Π_{x_l=1} C_l^(−2) · (1 + M_x·N) · h_s^a for every x (module docstring).

    plaintexts[x] = M_x = (|x|·Σ_{s occupied} 2^(ws) + R_x) mod N.
    """
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
    out = []
    for row, m, digits in zip(patterns.tolist(), plaintexts, table.random_digits(len(plaintexts))):
        acc = tables[0][row[0]]
        for t, d in zip(tables[1:], row[1:]):
            if d:
                acc = t_mod(acc * t[d], n2)
        # The fresh randomised encryption is mandatory: without it D carries only A's own
        # randomness and A could test guesses of x (docs/design.md §5.3).
        fresh = t_mod((1 + mpz(m) * pub.n) * table.power_digits(digits), n2)
        out.append(t_mod(acc * fresh, n2))
    return ciphertexts_to_bytes(out, pub)


def draw_masks(count: int, modulus: int) -> list[int]:
    """`count` masks R uniform in [0, modulus) from the OS CSPRNG (`secrets.randbelow`)."""
    return [secrets.randbelow(modulus) for _ in range(count)]


def occupied_ones(layout: SlotLayout, n_A: int, g: int) -> int:
    """Σ_{s occupied} 2^(ws) for batch g: a 1 in each slot holding one of A's vectors (not padding)."""
    occupied = min(layout.slots, n_A - g * layout.slots)
    return sum(1 << (layout.width * s) for s in range(occupied))


def _patterns(bits: np.ndarray, L: int, g_bits: int) -> np.ndarray:
    """uint16[n_B, groups]: each vector's bit pattern in each group of g_bits, the index into that group's table."""
    n_B = len(bits)
    groups = -(-L // g_bits)
    padded = np.zeros((n_B, groups * g_bits), dtype=np.int64)
    padded[:, :L] = bits
    powers = np.int64(1) << np.arange(g_bits, dtype=np.int64)
    return (padded.reshape(n_B, groups, g_bits) @ powers).astype(np.uint16)


def evaluate_batches(
    public: PaillierPublicKey,
    slices: EncryptedSlices,
    codes_B: np.ndarray,
    batches: range,
    masks: list[int],
    executor: Executor | None = None,
    *,
    split: int = 1,
    group_bits: int | None = None,
    window: int = DEFAULT_WINDOW,
) -> bytes:
    """Role B on A's batches `batches` only: the ciphertexts D, batch-major (index (g − batches.start)·n_B + x),
    as fixed-width bytes; masks[i] is the mask R of the i-th of them.

    One task per batch, its rows cut into `split` parts (each part builds the batch's tables once
    more: only worth it when there are fewer batches than workers). The streamed SecureHamming
    (client/jobs/xclp.py) evaluates one piece of batches at a time with this.
    """
    layout = slices.layout
    if layout.modulus_bits != public.modulus_bits:
        raise ProtocolError(f"bit slices are for a {layout.modulus_bits}-bit modulus, A's key has "
                            f"{public.modulus_bits} bits")
    n_A = slices.n_A
    if batches.step != 1 or batches.start < 0 or batches.stop > layout.batches(n_A) or len(batches) < 1:
        raise InvalidInput(f"batches {batches.start}..{batches.stop} are not a range of A's {layout.batches(n_A)}")
    bits = code_bits(codes_B, layout.L, "codes_B")
    n_B = len(bits)
    if len(masks) != len(batches) * n_B:
        raise InvalidInput(f"{len(batches)} batches of {n_B} vectors need {len(batches) * n_B} masks, got {len(masks)}")
    parts = max(1, min(int(split), n_B))
    cuts = [n_B * i // parts for i in range(parts + 1)]
    g_bits = group_bits if group_bits is not None else choose_group_bits(layout.L, cuts[1] - cuts[0])
    if not 1 <= g_bits <= 16:
        raise InvalidInput(f"group_bits must be in [1, 16], got {g_bits}")
    patterns = _patterns(bits, layout.L, g_bits)
    weights = [int(w) for w in bits.sum(axis=1, dtype=np.int64)]
    n = int(public.n)
    state = (n, int(public.h_s), public.exponent_bits)
    tasks = []
    for i, g in enumerate(batches):
        ones = occupied_ones(layout, n_A, g)
        plaintexts = [(w * ones + r) % n for w, r in zip(weights, masks[i * n_B : (i + 1) * n_B])]
        batch = slices.batch(g)  # one object for every part: a cluster gets it once (crypto/pool.py)
        for lo, hi in zip(cuts, cuts[1:]):
            tasks.append((state, window, batch, patterns[lo:hi], g_bits, plaintexts[lo:hi], layout))
    return b"".join(run_tasks(_evaluate_batch, tasks, executor))


def evaluate(
    public: PaillierPublicKey,
    slices: EncryptedSlices,
    codes_B: np.ndarray,
    executor: Executor | None = None,
    *,
    group_bits: int | None = None,
    window: int = DEFAULT_WINDOW,
) -> tuple[EvaluatedDistances, Residues]:
    """Role B: masked encrypted distances to all of A's vectors, and the masks R (one per D).

    The masks go to the coordinator, the EvaluatedDistances to A. |x| is added to occupied slots
    only, so the padding slots of A's last batch decrypt (after unmasking) to exactly 0 — which
    the coordinator checks. (The service streams the same in pieces with `evaluate_batches`.)
    """
    layout = slices.layout
    n_B = len(code_bits(codes_B, layout.L, "codes_B"))
    masks = draw_masks(layout.values(slices.n_A, n_B), int(public.n))  # batch-major, like D
    out = evaluate_batches(public, slices, codes_B, range(layout.batches(slices.n_A)), masks, executor,
                           group_bits=group_bits, window=window)
    return EvaluatedDistances(layout, slices.n_A, n_B, out), Residues.from_ints(masks, layout.modulus_bits)
