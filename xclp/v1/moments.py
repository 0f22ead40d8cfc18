"""The "moments" step on the wire (docs/design.md §8): every party's (n_j, Σx_j, Σx_j²) per feature in
wide fixed point (crypto/fixedpoint.py WideFixedPoint), masked like every sum (docs/design.md §6.1).

Payload: uint64[3, d, LIMBS], each element one 32-bit digit of a 384-bit two's complement value
with 128 fractional bits. The coordinator sums the arrays mod 2^64, removes the self masks and
sends the sum back as message "moments_result"; both ends decode it with `decode` into the exact
pooled sums, from which xclp.data.prep.Scaling follows.

Neither Σx nor Σx² is summed as float64: a party centres its values on its own mean c and sums
D = Σ(x − c) and M2 = Σ(x − c)² (no cancellation), then forms Σx and Σx² from them exactly in the
fixed-point integers. The pooled variance (exact integers, xclp.data.prep) so keeps the digits that
float64 sums lose on a feature whose mean is large against its spread (a timestamp, say).

With moments_epsilon (xclp.privacy.dp_moments) the same payload carries, per feature, the noisy
(ñ, Σũ, Σũ²) of the range-scaled clipped values instead (`encode_private`), and `pooled_scaling`
post-processes them into the Scaling on both ends.
"""

from __future__ import annotations

import numpy as np

from xclp.crypto.fixedpoint import WideFixedPoint
from xclp.data.prep import Scaling
from xclp.errors import InvalidInput
from xclp.privacy import dp_moments
from xclp.v1.double_masking import reveal_step
from xclp.v1.params import JobParams
from xclp.v1.steps import MOMENTS_STEP

CODEC = WideFixedPoint()
LIMBS = CODEC.limbs
MAX_PARTIES = 2**32 - 1  # digit sums stay exact in Z_2^64 up to this many summands
REVEAL_STEP = reveal_step(MOMENTS_STEP)  # each party's self-mask seed, once the round is complete


def wire(dim: int) -> tuple[np.dtype, tuple[int, int, int]]:
    """dtype and shape of every party's moments payload for data of `dim` feature columns."""
    return np.dtype("<u8"), (3, dim, LIMBS)


def encode(local: np.ndarray, n_parties: int) -> np.ndarray:
    """float64[4, d] local (n, c, D, M2) of xclp.data.prep.local_moments -> uint64[3, d, LIMBS]: the
    fixed-point integers of (n, Σx = n·c + D, Σx² = M2 + n·c² + 2·c·D), each product formed
    exactly and rounded once; InvalidInput on NaN/inf or a value that could wrap among `n_parties`."""
    local = np.asarray(local, dtype=np.float64)
    if local.ndim != 2 or local.shape[0] != 4 or not np.isfinite(local).all():
        raise InvalidInput("local moments must be finite float64[4, d]")
    F = CODEC.frac_bits
    ints = np.empty((3, local.shape[1]), dtype=object)
    for j, (n, centre, deviation, m2) in enumerate(local.T.tolist()):
        count, c, dev = int(n), CODEC.scaled(centre), CODEC.scaled(deviation)
        square = _round_div(count * c * c + 2 * c * dev, 1 << F)  # (n·c² + 2·c·D) · 2^F
        ints[:, j] = [count << F, count * c + dev, CODEC.scaled(m2) + square]
    return CODEC.to_limbs(ints, n_terms=n_parties)


def encode_private(clipped: np.ndarray, share: np.ndarray, plan: dp_moments.MomentsPlan,
                   n_parties: int) -> np.ndarray:
    """A DP moments contribution (xclp.privacy.dp_moments): the party's clipped integer sums int64[3, d]
    and its noise share int64[plan.cells] on the noisy cells -> uint64[3, d, LIMBS] at 2^FRAC_BITS;
    InvalidInput for a value that could wrap among `n_parties`."""
    noise = np.zeros(clipped.shape, dtype=np.int64)
    noise[plan.noise_mask()] = share
    return CODEC.to_limbs(dp_moments.release(clipped, noise, plan, FRAC_BITS), n_terms=n_parties)


def pooled_scaling(params: JobParams, sums: np.ndarray, dim: int) -> Scaling:
    """What every side applies, from the opened sum as `decode` gives it (object[3, dim]): exact
    moments, or the DP moments' post-processing (xclp.privacy.dp_moments.scaling) when the job sets
    moments_epsilon."""
    impute = params.impute == "mean"
    plan = params.moments_plan(dim)
    if plan is None:
        return Scaling.from_sums(sums, FRAC_BITS, standardise=params.standardise, impute=impute)
    return dp_moments.scaling(sums, FRAC_BITS, plan, params.moments_ranges(dim), standardise=params.standardise,
                              impute=impute)


def decode(total: np.ndarray) -> np.ndarray:
    """uint64[3, d, LIMBS] unmasked sum -> object[3, d] of the exact pooled sums (n, Σx, Σx²),
    each an int scaled by 2^FRAC_BITS."""
    return CODEC.from_limbs(total)


FRAC_BITS = CODEC.frac_bits


def _round_div(a: int, b: int) -> int:
    """round(a / b) for integers, b > 0 (half away from zero is fine here)."""
    q, r = divmod(a, b)
    return q + (2 * r >= b)
