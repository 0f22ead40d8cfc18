"""Fixed-point codec between float64 and the ring Z_{2^bits} (docs/design.md §5.6).

x is encoded as v = round(x · 2^frac_bits) in two's complement (uint64 for 64 total bits, uint32
for 32), so masked sums mod 2^bits decode to the sum of the inputs. Wrapping would silently turn a
large sum into a wrong number, so `encode` refuses any value outside a safe range that leaves room
for adding `headroom_terms` encoded values:

    |v| <= (2^(total_bits−1) − 1) // headroom_terms          (checked on the rounded v)

Hence any sum of at most `headroom_terms` encoded values stays inside the signed range and decodes
exactly (up to float64 rounding of the result). Rounding is to nearest, ties to even, so the
round-trip error is at most 2^−(frac_bits+1).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from xclp.errors import InvalidInput

_DTYPES: dict[int, tuple[np.dtype[np.signedinteger], np.dtype[np.unsignedinteger]]] = {
    32: (np.dtype(np.int32), np.dtype(np.uint32)), 64: (np.dtype(np.int64), np.dtype(np.uint64))}


@dataclass(frozen=True)
class FixedPoint:
    """Signed fixed point with `frac_bits` fractional bits in a `total_bits` ring (32 or 64).

    `headroom_terms` is how many encoded values may be summed without overflow (default 1024
    parties/terms: with the default 2^32 scale that leaves |x| <= 2^21 ≈ 2.1e6). `encode` also
    takes `n_terms=` to override it per call.
    """

    frac_bits: int = 32
    total_bits: int = 64
    headroom_terms: int = 1024

    def __post_init__(self) -> None:
        if isinstance(self.total_bits, bool) or not isinstance(self.total_bits, int) or self.total_bits not in _DTYPES:
            raise InvalidInput(f"total_bits must be 32 or 64, got {self.total_bits!r}")
        if isinstance(self.frac_bits, bool) or not isinstance(self.frac_bits, int):
            raise InvalidInput(f"frac_bits must be an integer, got {self.frac_bits!r}")
        if not 0 <= self.frac_bits <= self.total_bits - 2:
            raise InvalidInput(
                f"frac_bits must be in [0, {self.total_bits - 2}] for a {self.total_bits}-bit ring, got "
                f"{self.frac_bits}"
            )
        _check_terms(self.headroom_terms, "headroom_terms")

    @property
    def signed_dtype(self) -> np.dtype[np.signedinteger]:
        return _DTYPES[self.total_bits][0]

    @property
    def ring_dtype(self) -> np.dtype[np.unsignedinteger]:
        """uint64 (or uint32) — the dtype of encoded arrays."""
        return _DTYPES[self.total_bits][1]

    @property
    def scale(self) -> float:
        return float(2**self.frac_bits)

    @property
    def max_abs(self) -> float:
        """Largest |x| `encode` accepts with the default `headroom_terms`."""
        return self.max_abs_for(self.headroom_terms)

    def max_abs_for(self, n_terms: int) -> float:
        """Largest |x| `encode` accepts when `n_terms` encoded values will be summed."""
        return _float_at_most(self.max_encoded(n_terms)) / self.scale

    def encode(self, x: np.ndarray | float, *, n_terms: int | None = None) -> np.ndarray:
        """float[...] -> ring_dtype[...] (same shape): round(x · 2^frac) in two's complement.

        Raises InvalidInput on NaN/inf or when |round(x · 2^frac)| exceeds the safe range for
        `n_terms` (default `headroom_terms`) summands — never wraps silently.
        """
        terms = self.headroom_terms if n_terms is None else _check_terms(n_terms, "n_terms")
        try:
            arr = np.asarray(x, dtype=np.float64)
        except (TypeError, ValueError) as exc:
            raise InvalidInput(f"values to encode must be numeric: {exc}") from None
        bad = ~np.isfinite(arr)
        if bad.any():
            where = tuple(int(i) for i in np.argwhere(bad)[0])
            raise InvalidInput(f"cannot encode {int(bad.sum())} NaN/inf values (first at index {where})")
        scaled = np.rint(arr * self.scale)  # exact power-of-two scaling, then ties-to-even
        limit = _float_at_most(self.max_encoded(terms))
        over = np.abs(scaled) > limit
        if over.any():
            where = tuple(int(i) for i in np.argwhere(over)[0])
            raise InvalidInput(
                f"{int(over.sum())} values exceed the fixed-point range |x| <= {limit / self.scale:.6g} "
                f"(frac_bits={self.frac_bits}, total_bits={self.total_bits}, room for {terms} summands); "
                f"first at index {where}: {arr[where]!r}. Rescale the data or lower frac_bits"
            )
        # `scaled` holds integers of magnitude <= limit < 2^(total_bits−1), so the cast is exact.
        return scaled.astype(self.signed_dtype).view(self.ring_dtype)

    def decode(self, u: np.ndarray) -> np.ndarray:
        """ring_dtype[...] -> float64[...]: interpret as two's complement and divide by 2^frac."""
        if not isinstance(u, np.ndarray) or u.dtype != self.ring_dtype:
            got = u.dtype if isinstance(u, np.ndarray) else type(u).__name__
            raise InvalidInput(f"decode expects a {self.ring_dtype} array, got {got}")
        return u.view(self.signed_dtype).astype(np.float64) / self.scale

    def max_encoded(self, n_terms: int) -> int:
        """The largest |v| one of `n_terms` encoded summands may have."""
        return (2 ** (self.total_bits - 1) - 1) // _check_terms(n_terms, "n_terms")


def _check_terms(n: int, name: str) -> int:
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise InvalidInput(f"{name} must be an integer >= 1, got {n!r}")
    return int(n)


def _float_at_most(limit: int) -> float:
    """The largest float64 not above the integer `limit` (float(2^63 − 1) would round up)."""
    f = float(limit)
    return math.nextafter(f, 0.0) if int(f) > limit else f


LIMB_BITS = 32


@dataclass(frozen=True)
class WideFixedPoint:
    """Fixed point wider than 64 bits, carried in 32-bit limbs of a Z_2^64 ring (docs/design.md §8).

    x is encoded as v = round(x · 2^frac_bits), two's complement mod 2^(32·limbs), split into
    `limbs` 32-bit digits, each stored in a uint64: float64[...] -> uint64[..., limbs]. Summing
    such arrays element-wise mod 2^64 (as the masked sum does) adds each digit exactly for up to
    2^32 summands, so `decode` recombines the digit sums into the exact integer sum. The default,
    128 fractional bits in 384 bits, holds sums of squares of any feature a float64 table can
    reasonably hold (|x|·√n below 2^127 ≈ 1.7e38) to a resolution of 2^−128.
    """

    frac_bits: int = 128
    limbs: int = 12

    def __post_init__(self) -> None:
        if not 1 <= self.limbs <= 24 or not 0 <= self.frac_bits <= LIMB_BITS * self.limbs - 2:
            raise InvalidInput(f"WideFixedPoint needs 1..24 limbs and frac_bits below their width, got "
                               f"{self.limbs} limbs, frac_bits={self.frac_bits}")

    @property
    def total_bits(self) -> int:
        return LIMB_BITS * self.limbs

    def limit(self, n_terms: int) -> int:
        """The largest |v| one summand may have so that `n_terms` of them cannot wrap."""
        return (2 ** (self.total_bits - 1) - 1) // _check_terms(n_terms, "n_terms")

    def scaled(self, value: float) -> int:
        """round(value · 2^frac_bits), exactly (a power-of-two scale, then an integer)."""
        return round(math.ldexp(value, self.frac_bits))

    def to_limbs(self, values: np.ndarray, *, n_terms: int) -> np.ndarray:
        """object[...] of Python ints (already scaled) -> uint64[..., limbs]; InvalidInput on a value
        that could wrap when `n_terms` are summed."""
        arr = np.asarray(values, dtype=object)
        limit, modulus, digit = self.limit(n_terms), 1 << self.total_bits, (1 << LIMB_BITS) - 1
        out = np.empty((*arr.shape, self.limbs), dtype=np.uint64)
        flat = out.reshape(-1, self.limbs)
        for k, v in enumerate(arr.reshape(-1).tolist()):
            if abs(v) > limit:
                where = tuple(int(i) for i in np.unravel_index(k, arr.shape))
                raise InvalidInput(f"value {math.ldexp(float(v), -self.frac_bits):.6g} at index {where} exceeds the "
                                   f"fixed-point range |x| <= {math.ldexp(limit, -self.frac_bits):.3g} for {n_terms} "
                                   f"summands")
            v %= modulus
            flat[k] = [(v >> (LIMB_BITS * i)) & digit for i in range(self.limbs)]
        return out

    def from_limbs(self, u: np.ndarray) -> np.ndarray:
        """uint64[..., limbs] digit sums -> object[...] of the signed integer sums (still scaled)."""
        if not isinstance(u, np.ndarray) or u.dtype != np.uint64 or u.ndim < 1 or u.shape[-1] != self.limbs:
            raise InvalidInput(f"expected uint64[..., {self.limbs}] digit sums")
        modulus, half = 1 << self.total_bits, 1 << (self.total_bits - 1)
        out = np.empty(u.shape[:-1], dtype=object)
        flat = out.reshape(-1)
        for k, digits in enumerate(u.reshape(-1, self.limbs).tolist()):
            v = sum(d << (LIMB_BITS * i) for i, d in enumerate(digits)) % modulus
            flat[k] = v - modulus if v >= half else v
        return out

    def encode(self, x: np.ndarray, *, n_terms: int) -> np.ndarray:
        """float64[...] -> uint64[..., limbs]; InvalidInput on NaN/inf or a value that could wrap."""
        arr = np.asarray(x, dtype=np.float64)
        bad = ~np.isfinite(arr)
        if bad.any():
            where = tuple(int(i) for i in np.argwhere(bad)[0])
            raise InvalidInput(f"cannot encode {int(bad.sum())} NaN/inf values (first at index {where})")
        ints = np.array([self.scaled(v) for v in arr.reshape(-1).tolist()], dtype=object).reshape(arr.shape)
        return self.to_limbs(ints, n_terms=n_terms)

    def decode(self, u: np.ndarray) -> np.ndarray:
        """uint64[..., limbs] digit sums -> float64[...]: the signed sum / 2^frac_bits."""
        ints = self.from_limbs(u)
        # |v| < 2^767 (at most 24 limbs): float(v) cannot overflow
        return np.array([math.ldexp(float(v), -self.frac_bits) for v in ints.reshape(-1).tolist()],
                        dtype=np.float64).reshape(ints.shape)
