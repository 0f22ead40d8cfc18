"""Signed random projections: the LSH step of XCLP (Scott et al. 2023 Alg. 1 lines 2-3, docs/design.md §5.1).

Every party draws the same Gaussian projection Π ∈ R^{L×d} from the common seed and turns each
feature row v into L bits b_l = [Π_l·v >= 0]. For two rows at angle θ each bit differs with
probability θ/π, so the Hamming distance H between two codes estimates the cosine similarity as
cos(π·H/L) (Charikar's SimHash).

Bit order of packed codes (a wire contract, docs/design.md §3): bit l of a row lives in uint64 word l // 64
at bit position l % 64 (least-significant bit first). Words are little-endian on the wire.
"""

from __future__ import annotations

import numpy as np

from xclp.data.validation import check_features
from xclp.errors import InvalidInput
from xclp.seeding import Seed, public_rng

WORD_BITS = 64

# Rows projected per block in `lsh_codes`: bounds the float64[block, L] temporary (32 MiB at L=4096).
_ROW_BLOCK = 1024


def check_lsh_bits(lsh_bits: object) -> int:
    """Return `lsh_bits` as an int; it must be a positive multiple of 64 (codes pack into uint64)."""
    if isinstance(lsh_bits, bool) or not isinstance(lsh_bits, (int, np.integer)):
        raise InvalidInput(f"the number of LSH bits L must be an integer, got {lsh_bits!r}")
    if lsh_bits <= 0 or lsh_bits % WORD_BITS != 0:
        raise InvalidInput(
            f"the number of LSH bits L must be a positive multiple of 64 (codes pack into uint64 words), "
            f"got {lsh_bits}; try {max(WORD_BITS, (int(lsh_bits) + WORD_BITS - 1) // WORD_BITS * WORD_BITS)}"
        )
    return int(lsh_bits)


def lsh_projection(seed: Seed, lsh_bits: int, dim: int) -> np.ndarray:
    """The public projection Π: float64[L, d] with i.i.d. N(0, 1) entries from `public_rng(seed, "lsh")`.

    Every party calls this with the common seed (docs/design.md §4.3) and gets the same Π.
    """
    lsh_bits = check_lsh_bits(lsh_bits)
    if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)) or dim <= 0:
        raise InvalidInput(f"the feature dimension d must be a positive integer, got {dim!r}")
    return public_rng(seed, "lsh").standard_normal((lsh_bits, int(dim)))


def lsh_codes(X: object, projection: np.ndarray) -> np.ndarray:
    """Packed LSH codes of the rows of `X`: uint64[n, L/64] (bit order in the module docstring).

    X: float[n, d] features; projection: float64[L, d] from `lsh_projection`. Rows are
    L2-normalised first (docs/design.md §5.1: signs do not change, numerics stay tame); an all-zero row
    stays zero, so every projection is 0 and its code is all ones.
    """
    projection = np.asarray(projection, dtype=np.float64)
    if projection.ndim != 2:
        raise InvalidInput(f"the LSH projection must be a 2-D float array [L, d], got shape {projection.shape}")
    lsh_bits = check_lsh_bits(projection.shape[0])
    if not np.all(np.isfinite(projection)):
        raise InvalidInput("the LSH projection contains NaN/inf; build it with lsh_projection(seed, L, d)")
    X = check_features(X, d=projection.shape[1])
    norms = np.linalg.norm(X, axis=1, keepdims=True)
    X = X / np.where(norms > 0.0, norms, 1.0)
    n = X.shape[0]
    codes = np.empty((n, lsh_bits // WORD_BITS), dtype=np.uint64)
    for start in range(0, n, _ROW_BLOCK):
        bits = (X[start : start + _ROW_BLOCK] @ projection.T) >= 0.0
        codes[start : start + _ROW_BLOCK] = pack_bits(bits)
    return codes


def pack_bits(bits: np.ndarray) -> np.ndarray:
    """Pack bool/uint8[n, L] (L a multiple of 64) into uint64[n, L/64], bit l -> word l//64, position l%64."""
    bits = np.asarray(bits)
    if bits.ndim != 2:
        raise InvalidInput(f"bits must be a 2-D array [n, L], got shape {bits.shape}")
    check_lsh_bits(bits.shape[1])
    # LSB-first bytes, read as little-endian words, put bit l at position l % 64 of word l // 64.
    packed = np.packbits(bits.astype(bool), axis=1, bitorder="little")
    return np.ascontiguousarray(packed).view("<u8").astype(np.uint64)


def unpack_codes(codes: np.ndarray, lsh_bits: int) -> np.ndarray:
    """Inverse of the packing: uint64[n, L/64] -> uint8[n, L] of 0/1 bits."""
    lsh_bits = check_lsh_bits(lsh_bits)
    codes = np.asarray(codes)
    if codes.ndim != 2 or codes.dtype != np.uint64:
        raise InvalidInput(f"codes must be uint64[n, L/64], got dtype {codes.dtype} and shape {codes.shape}")
    if codes.shape[1] * WORD_BITS != lsh_bits:
        raise InvalidInput(f"codes have {codes.shape[1]} words = {codes.shape[1] * WORD_BITS} bits, not L = {lsh_bits}")
    as_bytes = np.ascontiguousarray(codes.astype("<u8")).view(np.uint8)
    return np.unpackbits(as_bytes, axis=1, bitorder="little")


def estimate_cosine(hamming: np.ndarray | int, lsh_bits: int) -> np.ndarray:
    """Cosine similarity estimated from Hamming distances: cos(π·H/L), float64 of H's shape."""
    lsh_bits = check_lsh_bits(lsh_bits)
    return np.cos(np.pi * np.asarray(hamming, dtype=np.float64) / lsh_bits)
