"""DP for the pooled moments (fourth piece; docs/design.md §8): `moments_epsilon`.

A job that standardises or imputes releases every feature's pooled mean and standard deviation.
Without DP these are exact, and a coordinator differencing two runs (or rounds of parties) learns
one party's sums exactly. With `moments_epsilon` they are released with record-level DP: the unit
is one row of one party, replaced by another (the party's row count stays; as in xclp.privacy.dpsgd).

**Clipping to public bounds.** The job names a range [lo, hi] per feature (`moments_bounds`). A
party maps each present cell to u = (clip(x, lo, hi) − lo) / (hi − lo) ∈ [0, 1] and sums, per
feature, three integers at scale 2^g (`local_sums`):

    count = 2^g · (present cells),   A = Σ round(u · 2^g),   B = Σ round(u² · 2^g)

Each row adds at most 2^g to every cell and at least 0, so replacing one row moves each cell of a
feature by at most 2^g — there is no rounding term: the rounding happens on the row, inside the
function whose sensitivity is bounded. The counts change only if a row's missing cells can
change, i.e. with impute = "mean"; otherwise every feature's count is the party's row count and is
released exactly. With k noisy cells per feature (k = 3 with impute = "mean", else 2):

    Δ₂ = 2^g · √(k·d),   Δ₁ = 2^g · k·d

**Noise.** Symmetric Skellam of variance μ per noisy cell, μ the smallest for which this one
release is (ε, δ)-DP (xclp.privacy.accounting). It is distributed as the training jobs' noise is: each of
the sum's m parties adds a share of variance μ/(m − 1), so any m − 1 shares already make μ — against
the coordinator, and against a party that subtracts its own; a restarted sum tops the same share
up (xclp.privacy.dpsgd.RoundNoise), so a restart is no second release. g = 16 unless μ would exceed what is
drawn exactly, then lower (`plan`).

**What every side does with the release (post-processing, `scaling`).** The pooled sums, in the
wide fixed-point ring as before, give ñ, Ã/ñ and B̃/ñ per feature; the mean in u is clamped to
[0, 1], the variance to [floor, 1/4] with floor = σ/(2^g·ñ), the noise's own standard deviation on
B̃/ñ (a feature whose variance the noise hides is scaled by the noise level, never divided by a
value the noise made tiny). Mapped back: mean = lo + (hi − lo)·mean_u, std = (hi − lo)·std_u.
Under DP no column is dropped for being constant — whether it is, is itself a release; a column
with no present cell anywhere (ñ < 1) is dropped. Cells outside the bounds are clipped for the
moments only; the party's table itself is not clipped.

The total ε of a job with DP moments is its releases' ε plus moments_epsilon, and its δ the sum of
the two δ (basic composition; JobParams.epsilon_total).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from xclp.data.prep import Scaling
from xclp.errors import InvalidInput
from xclp.privacy.accounting import MAX_VARIANCE, skellam_curve, skellam_variance

SCALE_BITS = 16  # u on a 2^-16 grid: far finer than the noise on any pooled mean
MIN_SCALE_BITS = 8
TAIL_SIGMAS = 40.0


def bounds_array(bounds: Sequence[Sequence[float]], dim: int) -> np.ndarray:
    """float64[dim, 2] from one (lo, hi) for every feature or one per feature; InvalidInput if the
    count does not match `dim` or a range is empty."""
    pairs = np.asarray(bounds, dtype=np.float64)
    if pairs.ndim != 2 or pairs.shape[1] != 2 or pairs.shape[0] not in (1, dim):
        raise InvalidInput(f"moments_bounds gives {len(bounds)} [lo, hi] ranges for {dim} feature columns: give one "
                           f"for all, or one per feature column (after categorical columns are expanded)")
    if not np.isfinite(pairs).all() or not (pairs[:, 0] < pairs[:, 1]).all():
        raise InvalidInput("every moments_bounds range must be finite with lo < hi")
    return np.broadcast_to(pairs, (dim, 2)).copy()


def unit_values(X: np.ndarray, bounds: np.ndarray) -> np.ndarray:
    """float64[n, d]: every cell clipped to its feature's bounds and mapped to [0, 1]; NaN stays."""
    lo, hi = bounds[:, 0], bounds[:, 1]
    with np.errstate(invalid="ignore"):
        return (np.clip(X, lo, hi) - lo) / (hi - lo)


def outside(X: np.ndarray, bounds: np.ndarray) -> np.ndarray:
    """int64[d]: cells per feature that the bounds clip (the party's own report; never sent)."""
    with np.errstate(invalid="ignore"):
        lo, hi = bounds[:, 0], bounds[:, 1]
        return ((lo > X) | (hi < X)).sum(axis=0)


def local_sums(X: np.ndarray, bounds: np.ndarray, scale_bits: int) -> np.ndarray:
    """int64[3, d]: (2^g · present cells, Σ round(u·2^g), Σ round(u²·2^g)) per feature over the
    present cells (module docstring)."""
    u = unit_values(np.asarray(X, dtype=np.float64), bounds)
    present = ~np.isnan(u)
    u = np.where(present, u, 0.0)
    scale = float(1 << scale_bits)
    a = np.rint(u * scale).astype(np.int64)
    b = np.rint(u * u * scale).astype(np.int64)
    return np.stack([present.sum(axis=0, dtype=np.int64) << scale_bits, a.sum(axis=0), b.sum(axis=0)])


@dataclass(frozen=True)
class MomentsPlan:
    """The noise of a job's DP moments, the same on every party and the coordinator.

    dim: the table's feature columns; noisy_counts: impute = "mean" (present-cell counts are
    noised too); scale_bits: g; variance: μ per noisy cell, from any m − 1 of a sum's m parties."""

    epsilon: float
    delta: float
    dim: int
    noisy_counts: bool
    scale_bits: int
    variance: float

    @property
    def cells(self) -> int:
        """Noisy cells: two (or three, with the counts) per feature."""
        return (3 if self.noisy_counts else 2) * self.dim

    @property
    def l2(self) -> float:
        return float(1 << self.scale_bits) * math.sqrt(self.cells)

    @property
    def l1(self) -> float:
        return float(1 << self.scale_bits) * self.cells

    @property
    def std(self) -> float:
        """σ of the pooled noise per cell, in rows (a count) or in u-units summed over rows."""
        return math.sqrt(self.variance) / (1 << self.scale_bits)

    @property
    def rdp(self) -> tuple[float, ...]:
        """The release's RDP curve (xclp.privacy.accounting.ORDERS), which the party's ledger composes across runs."""
        return skellam_curve(self.l2, self.l1, self.variance)

    def noise_mask(self) -> np.ndarray:
        """bool[3, d]: the cells that get noise."""
        mask = np.ones((3, self.dim), dtype=bool)
        mask[0] = self.noisy_counts
        return mask

    def report(self) -> dict[str, object]:
        """What the release spent, as the party's JobResult.privacy and the coordinator's summary
        carry it under "moments" (a one-off release: all of it once the sum opened)."""
        return {"epsilon_spent": self.epsilon, "delta": self.delta, "noise_std": round(self.std, 6),
                "noisy_counts": self.noisy_counts,
                "line": f"DP moments: ε = {self.epsilon:g}, δ = {self.delta:g}, noise σ = {self.std:.3g}"}

    def describe(self) -> str:
        counts = ", and every feature's count of present cells" if self.noisy_counts else ""
        return (f"ε = {self.epsilon:g}, δ = {self.delta:g}; noise σ = {self.std:.3g} on the sums of the "
                f"range-scaled values and their squares{counts}, shared among the parties")


def plan(epsilon: float, delta: float, dim: int, *, noisy_counts: bool) -> MomentsPlan:
    """The Skellam variance for one release of the moments at (ε, δ); InvalidInput if no scale
    from 2^16 down to 2^8 lets it be drawn exactly."""
    if not math.isfinite(epsilon) or epsilon <= 0:
        raise InvalidInput(f"moments_epsilon must be finite and > 0, got {epsilon!r}")
    if not 0 < delta < 1:
        raise InvalidInput(f"moments_delta must be in (0, 1), got {delta!r}")
    if dim < 1:
        raise InvalidInput(f"DP moments need at least one feature, got {dim}")
    for g in range(SCALE_BITS, MIN_SCALE_BITS - 1, -1):
        probe = MomentsPlan(epsilon, delta, dim, noisy_counts, g, 1.0)
        variance = skellam_variance(epsilon, delta, probe.l2, probe.l1)
        if variance is not None and variance * 2 <= MAX_VARIANCE:  # room for a top-up after a restart
            return MomentsPlan(epsilon, delta, dim, noisy_counts, g, variance)
    raise InvalidInput(f"moments_epsilon = {epsilon:g} over {dim} features needs more noise than can be drawn "
                       "exactly: raise moments_epsilon")


def release(sums: np.ndarray, noise: np.ndarray, plan: MomentsPlan, frac_bits: int) -> np.ndarray:
    """object[3, d] Python ints at 2^frac_bits: the local sums plus this party's noise share
    (int64[3, d], zero where `noise_mask` is off), shifted exactly from 2^g."""
    if sums.shape != (3, plan.dim) or noise.shape != sums.shape:
        raise InvalidInput(f"DP moments are int64[3, {plan.dim}], got {sums.shape} and {noise.shape}")
    if (noise[~plan.noise_mask()] != 0).any():
        raise InvalidInput("noise on the exact counts of a job that does not impute")
    shift = frac_bits - plan.scale_bits
    out = np.empty(sums.shape, dtype=object)
    for index, value in np.ndenumerate(sums.astype(object) + noise.astype(object)):
        out[index] = int(value) << shift
    return out


def scaling(sums: np.ndarray, frac_bits: int, plan: MomentsPlan, bounds: np.ndarray, *, standardise: bool,
            impute: bool) -> Scaling:
    """The Scaling every side applies, from the noisy pooled sums object[3, d] (ints at
    2^frac_bits: ñ, Σũ, Σũ²), by post-processing only (module docstring)."""
    d = plan.dim
    mean, std, kept = np.zeros(d), np.zeros(d), np.zeros(d, dtype=bool)
    unit = 1 << frac_bits
    for j in range(d):
        n = Fraction(int(sums[0, j]), unit)
        if n < 1:
            continue
        first = min(max(Fraction(int(sums[1, j]), unit) / n, Fraction(0)), Fraction(1))
        second = min(max(Fraction(int(sums[2, j]), unit) / n, Fraction(0)), Fraction(1))
        floor = plan.std / float(n)
        variance = min(max(float(second - first * first), floor), 0.25)
        width = float(bounds[j, 1]) - float(bounds[j, 0])
        mean[j] = float(bounds[j, 0]) + width * float(first)
        std[j] = width * math.sqrt(variance)
        kept[j] = True
    return Scaling(mean, std, kept, standardise, impute)
