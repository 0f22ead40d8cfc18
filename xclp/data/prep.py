"""Data preparation every job may ask for (docs/design.md §8): pooled moments, standardisation, imputation.

Each party computes, per feature j over its non-missing cells, the moments (n_j, Σx, Σx²); the
masked sum of all parties' moments (the "moments" step) gives the pooled mean and the pooled
(population) standard deviation, which every party applies alike:

    x' = (x − mean_j) / std_j            (standardise)
    x  = mean_j where x is missing       (impute = "mean"; before scaling)

A feature whose pooled std is 0 (below 1e-7·|mean|: float rounding of a constant) or that is
missing everywhere carries no information and is dropped by every party, so dimensions agree.
Pure functions: the protocol that sums the moments lives in xclp.v1.moments and the job code.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from xclp.errors import InvalidInput

CONSTANT_REL_STD = 1e-7  # std at or below this × |mean| is float rounding of a constant column


def local_moments(X: np.ndarray) -> np.ndarray:
    """float64[4, d]: per feature the count n of non-missing cells, a centre c (their mean, as
    float64), D = Σ(x − c) and M2 = Σ(x − c)², over the non-missing cells.

    Centred, so no digits cancel in float64: xclp.v1.moments forms Σx = n·c + D and
    Σx² = M2 + n·c² + 2·c·D exactly in fixed-point integers. Raises InvalidInput if a square
    overflows float64 (values near 1e154 cannot be standardised).
    """
    present = ~np.isnan(X)
    n = present.sum(axis=0).astype(np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        total = np.where(present, X, 0.0).sum(axis=0)
        centre = np.divide(total, n, out=np.zeros_like(total), where=n > 0)
        deviation = np.where(present, X - centre, 0.0)
        moments = np.stack([n, centre, deviation.sum(axis=0), np.square(deviation).sum(axis=0)])
    bad = ~np.isfinite(moments)
    if bad.any():
        col = int(np.argwhere(bad)[0][1])
        raise InvalidInput(f"feature column {col + 1} has values too large to standardise (their squares "
                           "overflow float64); rescale that column")
    return moments


@dataclass(frozen=True)
class Scaling:
    """What every party applies: mean float64[d], std float64[d], kept bool[d] (d = the table's
    feature columns), and which of standardise/impute the job asked for."""

    mean: np.ndarray
    std: np.ndarray
    kept: np.ndarray
    standardise: bool
    impute: bool

    @classmethod
    def from_sums(cls, sums: np.ndarray, frac_bits: int, *, standardise: bool, impute: bool) -> Scaling:
        """The pooled mean and population std from exact pooled sums object[3, d] (n, Σx, Σx², each
        an int scaled by 2^frac_bits, xclp.v1.moments.decode); the variance is formed in integers."""
        d = sums.shape[1]
        mean, std = np.zeros(d), np.zeros(d)
        for j in range(d):
            n = sums[0, j] >> frac_bits
            if n <= 0:
                continue
            s1, s2 = sums[1, j], sums[2, j]
            mean[j] = Fraction(s1, n << frac_bits)
            # Σx²/n − (Σx/n)² = (n·s2·2^F − s1²) / (n² · 2^2F), exactly in integers
            var = Fraction(n * s2 * (1 << frac_bits) - s1 * s1, (n * n) << (2 * frac_bits))
            std[j] = math.sqrt(max(float(var), 0.0))
        n_present = np.array([int(v) > 0 for v in sums[0]], dtype=bool)
        kept = n_present & (std > CONSTANT_REL_STD * np.abs(mean))
        return cls(mean, std, kept, standardise, impute)

    @property
    def dim(self) -> int:
        """Features after preparation."""
        return int(self.kept.sum())

    def dropped(self, columns: Sequence[str] = ()) -> list[str]:
        """Names (or 1-based numbers) of the dropped features."""
        return [columns[int(j)] if columns else str(j + 1) for j in np.flatnonzero(~self.kept)]

    def apply(self, X: np.ndarray) -> np.ndarray:
        """float64[n, d] (NaN = missing) -> float64[n, dim]: impute, scale, drop."""
        if X.ndim != 2 or X.shape[1] != self.mean.shape[0]:
            raise InvalidInput(f"the data has {X.shape[1] if X.ndim == 2 else '?'} feature columns; the job's "
                               f"preparation was computed for {self.mean.shape[0]}")
        out = X[:, self.kept]  # a copy: the caller's matrix is never changed
        mean, std = self.mean[self.kept], self.std[self.kept]
        if self.impute:
            missing = np.isnan(out)
            if missing.any():
                out[missing] = np.broadcast_to(mean, out.shape)[missing]
        if self.standardise:
            out -= mean
            out /= std
        return out

    def to_arrays(self) -> dict[str, np.ndarray]:
        return {"prep_mean": self.mean, "prep_std": self.std, "prep_kept": self.kept,
                "prep_flags": np.array([self.standardise, self.impute])}

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray]) -> Scaling | None:
        if "prep_mean" not in arrays:
            return None
        flags = np.asarray(arrays["prep_flags"], dtype=bool)
        return cls(np.asarray(arrays["prep_mean"], dtype=np.float64), np.asarray(arrays["prep_std"], dtype=np.float64),
                   np.asarray(arrays["prep_kept"], dtype=bool), bool(flags[0]), bool(flags[1]))

