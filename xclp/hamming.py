"""Hamming distance matrices between packed LSH codes (docs/design.md §5.2: intra-party block in the clear).

The coordinator learns the full n×n matrix H; each party computes its own n_j×n_j block with
`hamming_matrix(codes)`, and tests compare SecureHamming's cross blocks with
`hamming_matrix(codes_i, codes_j)`.

The kernel is a numba `prange` loop over rows of A with a branch-free popcount on the XOR of
64-bit words, writing straight into the output: no n×n integer temporaries, so memory is just the
output (uint16: 800 MB at n = 20 000).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from xclp.errors import InvalidInput

# Distances are at most L = 64·w; uint16 holds them up to L = 65535.
_UINT16_MAX_BITS = np.iinfo(np.uint16).max

_M1 = np.uint64(0x5555555555555555)
_M2 = np.uint64(0x3333333333333333)
_M4 = np.uint64(0x0F0F0F0F0F0F0F0F)
_H01 = np.uint64(0x0101010101010101)


@njit(inline="always", cache=True)
def popcount64(x: np.uint64) -> np.uint64:  # pragma: no cover - compiled
    """The set bits of one 64-bit word, branch-free (SWAR; LLVM lowers it to POPCNT where available),
    for numba kernels over packed codes."""
    x = x - ((x >> np.uint64(1)) & _M1)
    x = (x & _M2) + ((x >> np.uint64(2)) & _M2)
    x = (x + (x >> np.uint64(4))) & _M4
    return (x * _H01) >> np.uint64(56)


@njit(parallel=True, cache=True)
def _hamming_kernel(A: np.ndarray, B: np.ndarray, out: np.ndarray) -> None:  # pragma: no cover - compiled
    n_a, n_words = A.shape
    n_b = B.shape[0]
    for i in prange(n_a):
        for j in range(n_b):
            total = 0
            for t in range(n_words):
                # SWAR popcount (LLVM lowers it to POPCNT where available).
                x = A[i, t] ^ B[j, t]
                x = x - ((x >> np.uint64(1)) & _M1)
                x = (x & _M2) + ((x >> np.uint64(2)) & _M2)
                x = (x + (x >> np.uint64(4))) & _M4
                total += (x * _H01) >> np.uint64(56)
            out[i, j] = total


def _check_codes(codes: object, name: str) -> np.ndarray:
    arr = np.asarray(codes)
    if arr.ndim != 2:
        raise InvalidInput(
            f"{name} must be a 2-D array of packed codes uint64[n, L/64], got a {arr.ndim}-D array of shape {arr.shape}"
        )
    if arr.dtype != np.uint64:
        raise InvalidInput(f"{name} must have dtype uint64 (packed LSH codes from lsh_codes), got {arr.dtype}")
    if arr.shape[1] == 0:
        raise InvalidInput(f"{name} has zero words per code; L must be a positive multiple of 64")
    return np.ascontiguousarray(arr)


def hamming_dtype(lsh_bits: int) -> np.dtype:
    """Output dtype of `hamming_matrix` for L-bit codes: uint16 up to L = 65535, else int32."""
    return np.dtype(np.uint16) if lsh_bits <= _UINT16_MAX_BITS else np.dtype(np.int32)


def hamming_matrix(A: object, B: object | None = None) -> np.ndarray:
    """All pairwise Hamming distances H[i, j] = popcount(A[i] XOR B[j]).

    A: uint64[nA, w], B: uint64[nB, w] (default: A itself). Returns uint16[nA, nB] when
    L = 64·w <= 65535, else int32[nA, nB].
    """
    A = _check_codes(A, "A")
    B = A if B is None else _check_codes(B, "B")
    if A.shape[1] != B.shape[1]:
        raise InvalidInput(
            f"A and B must have the same code length, got {A.shape[1]} and {B.shape[1]} uint64 words "
            f"(L = {64 * A.shape[1]} vs {64 * B.shape[1]} bits); encode both with the same projection"
        )
    out = np.empty((A.shape[0], B.shape[0]), dtype=hamming_dtype(64 * A.shape[1]))
    if out.size:
        _hamming_kernel(A, B, out)
    return out
