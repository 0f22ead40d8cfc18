"""Fixed-point codec between float64 and the ring Z_{2^bits} (DESIGN §5.6).

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

_DTYPES = {32: (np.dtype(np.int32), np.dtype(np.uint32)), 64: (np.dtype(np.int64), np.dtype(np.uint64))}


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
                f"frac_bits must be in [0, {self.total_bits - 2}] for a {self.total_bits}-bit ring, got {self.frac_bits}"
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
        return _float_at_most(self._limit(n_terms)) / self.scale

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
        limit = _float_at_most(self._limit(terms))
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

    def _limit(self, n_terms: int) -> int:
        return (2 ** (self.total_bits - 1) - 1) // _check_terms(n_terms, "n_terms")


def _check_terms(n: int, name: str) -> int:
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise InvalidInput(f"{name} must be an integer >= 1, got {n!r}")
    return int(n)


def _float_at_most(limit: int) -> float:
    """The largest float64 not above the integer `limit` (float(2^63 − 1) would round up)."""
    f = float(limit)
    return math.nextafter(f, 0.0) if int(f) > limit else f
