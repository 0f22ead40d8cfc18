"""The "moments" step on the wire (DESIGN §8): every party's (n_j, Σx_j, Σx_j²) per feature in
wide fixed point (crypto/fixedpoint.py WideFixedPoint), masked like every sum (DESIGN §6.1).

Payload: uint64[3, d, LIMBS], each element one 32-bit digit of a 384-bit two's complement value
with 128 fractional bits. The coordinator sums the arrays mod 2^64, removes the self masks and
sends the sum back as message "moments_result"; both ends decode it with `decode` into the exact
pooled sums, from which xclp.prep.Scaling follows.

Σx² is not summed as float64 squares: a party computes its centred M2 = Σ(x − x̄)² (no
cancellation) and adds S²/n exactly in the fixed-point integers, so the value it sends is Σx² to
2^−128, and the pooled variance (computed in exact integers, xclp.prep) does not lose the digits
that float64 would lose on a feature whose mean is large against its spread.
"""

from __future__ import annotations

import numpy as np

from xclp.crypto.fixedpoint import WideFixedPoint
from xclp.errors import InvalidInput

CODEC = WideFixedPoint()
LIMBS = CODEC.limbs
MAX_PARTIES = 2**32 - 1  # digit sums stay exact in Z_2^64 up to this many summands


def wire(dim: int) -> tuple[np.dtype, tuple[int, int, int]]:
    """dtype and shape of every party's moments payload for data of `dim` feature columns."""
    return np.dtype("<u8"), (3, dim, LIMBS)


def encode(local: np.ndarray, n_parties: int) -> np.ndarray:
    """float64[3, d] local (n, S = Σx, M2 = Σ(x − S/n)²) -> uint64[3, d, LIMBS] of the fixed-point
    integers (n, S, Σx²), refusing NaN/inf or any value that could wrap in a sum of `n_parties`."""
    local = np.asarray(local, dtype=np.float64)
    if local.ndim != 2 or local.shape[0] != 3 or not np.isfinite(local).all():
        raise InvalidInput("local moments must be finite float64[3, d]")
    ints = np.empty(local.shape, dtype=object)
    for j, (n, total, m2) in enumerate(local.T.tolist()):
        s = CODEC.scaled(total)
        # S²/n in the scaled integers: (s/2^F)²/n · 2^F = s²/(n · 2^F), rounded once
        between = _round_div(s * s, int(n) << CODEC.frac_bits) if n else 0
        ints[:, j] = [int(n) << CODEC.frac_bits, s, CODEC.scaled(m2) + between]
    return CODEC.to_limbs(ints, n_terms=n_parties)


def decode(total: np.ndarray) -> np.ndarray:
    """uint64[3, d, LIMBS] unmasked sum -> object[3, d] of the exact pooled sums (n, Σx, Σx²),
    each an int scaled by 2^FRAC_BITS."""
    return CODEC.from_limbs(total)


FRAC_BITS = CODEC.frac_bits


def _round_div(a: int, b: int) -> int:
    """round(a / b) for integers, b > 0 (half away from zero is fine here)."""
    q, r = divmod(a, b)
    return q + (2 * r >= b)
