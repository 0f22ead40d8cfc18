"""Label-DP for XCLP's SecureRowSums (docs/design.md §2, "what a crafted computation can still do").

Party j's contribution to SecureRowSums is Z̄ = S_L Y_L over the graph rows (docs/design.md §5.6): S_L its
influence columns as the coordinator sent them, Y_L its one-hot labels. The coordinator computes
S, and a coordinator colluding with party k can craft it so that k's scores carry j's labels
(a column of S that is 1 on one of k's rows and 0 elsewhere hands k one label of j). Label-DP
bounds what any block can reveal; the unit is one label of party j. Two mechanisms
(`label_dp_mechanism`), both drawn once so that a restarted SecureRowSums attempt resends the same
values (restricted to its smaller frame) and is no second release; both leave the party's own rows,
which it keeps, exact.

**Randomised response ("response", the default).** Before anything leaves, each label is kept
with probability p = e^ε / (e^ε + K − 1) and otherwise replaced by one of the K − 1 other values,
uniformly (`randomised_response`); K = C classes, or C + 1 with `hide_label_mask`, where whether a
row is labeled is secret too and "unlabeled" is one more value. That is ε-DP for each label with
δ = 0, and Z̄ on the released rows is S_L Ỹ_L, a function of the block and the randomised labels
only: post-processing, whatever block the coordinator sent. Class counts for label_norm = "party"
are Ỹ's. In expectation Ỹ = (p − q)·Y + q (q = (1 − p)/(K − 1)), so the scores' argmax is kept and
propagation averages the flips out.

**Skellam noise on the row sums ("skellam").** Changing row i's label from a to b moves column a
of Z̄ by −S[:, i] and column b by +S[:, i]; making an unlabeled row labeled (only possible to hide
when the coordinator does not know the labeled rows, `hide_label_mask`) moves one column by
S[:, i]. Over the rows j releases (every graph row but its own), with c₂ and c₁ the largest L2 and
L1 norm of a received column on those rows (`largest_columns`), the release moves by at most
√2·c₂ in L2 and 2·c₁ in L1. The release is an integer vector in the SecureRowSums ring:
q = round(Z̄·2^g) + Skellam(μ) per cell, shifted up to the job's fixed point 2^frac_bits
(post-processing). Rounding moves a cell that changes by at most 1 more, and only cells of the two
columns change, so

    Δ₂ = √2·c₂·2^g + √(2r),   Δ₁ = 2·c₁·2^g + 2r        (r = released rows)

with 2^g chosen so that the rounding's √(2r) is at most 1/64 of √2·c₂·2^g (`scale_bits`). μ is the
smallest Skellam variance giving (ε, δ) for this one release (xclp.privacy.accounting). Each party adds
all of its own noise: it protects j's labels against the party that reads the sum, which might be
the one colluding. The noise does not grow with the number of classes, but a column of S reaches
1/(1 − α) in its own row's neighbourhood, and on the demo data (α = 0.99) this costs far more
accuracy than randomised response at every ε (docs/privacy.md).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from xclp.data.validation import UNLABELED
from xclp.errors import InvalidInput
from xclp.privacy.accounting import ORDERS, skellam_curve, skellam_variance
from xclp.privacy.noise import skellam_share, uniform_open

MECHANISMS = ("response", "skellam")

SCALE_MARGIN = 64  # √2·c₂·2^g >= 64·√(2r): the rounding adds at most 1/64 to the sensitivity
MAX_SHIFT = 62  # 2^(frac_bits − g) stays an int64 factor
TAIL_SIGMAS = 40.0  # noise beyond 40 standard deviations: probability below 10^-340 per cell


def keep_probability(epsilon: float, values: int) -> float:
    """p = e^ε / (e^ε + K − 1): randomised response over K values keeps the true one with p."""
    if not math.isfinite(epsilon) or epsilon <= 0:
        raise InvalidInput(f"label_dp_epsilon must be finite and > 0, got {epsilon!r}")
    if values < 2:
        raise InvalidInput(f"randomised response needs at least 2 values, got {values}")
    return 1.0 / (1.0 + (values - 1) * math.exp(-epsilon))


def response_values(n_classes: int, *, hide_unlabeled: bool) -> int:
    """K: the values randomised response chooses among (the classes, and "unlabeled" when hidden)."""
    return n_classes + 1 if hide_unlabeled else n_classes


def randomised_response(labels: np.ndarray, n_classes: int, epsilon: float, *, hide_unlabeled: bool) -> np.ndarray:
    """int64[n]: each label kept with `keep_probability`, else one of the other values uniformly,
    from the OS CSPRNG. Without `hide_unlabeled` the values are the C classes and unlabeled rows
    (−1) stay unlabeled (the coordinator knows them); with it "unlabeled" is value C + 1 of the
    response, so a labeled row may come out unlabeled and an unlabeled one labeled."""
    y = np.asarray(labels, dtype=np.int64)
    values = response_values(n_classes, hide_unlabeled=hide_unlabeled)
    p = keep_probability(epsilon, values)
    v = np.where(y == UNLABELED, n_classes, y)  # "unlabeled" as value C
    # another value, uniformly: v + 1 + (r mod (K − 1)); the modulo bias is below (K − 1)/2^64
    shift = 1 + np.frombuffer(os.urandom(8 * y.size), dtype="<u8") % np.uint64(values - 1)
    flipped = (v + shift.astype(np.int64)) % values
    out = np.where(uniform_open(y.shape) < p, v, flipped)
    out[out == n_classes] = UNLABELED
    if not hide_unlabeled:
        out[y == UNLABELED] = UNLABELED
    return out


def largest_columns(S: np.ndarray | sp.spmatrix, own: slice) -> tuple[float, float]:
    """(c₂, c₁): the largest L2 and L1 norm of a column of S (float64[n, c], n the graph rows; dense
    or sparse) over the rows released, every row but `own`."""
    if sp.issparse(S):
        if S.shape[1] == 0:
            return 0.0, 0.0
        kept = sp.csr_matrix(S)
        others = sp.vstack([kept[: own.start], kept[own.stop :]]).tocsc()
        squares = np.asarray(others.multiply(others).sum(axis=0)).ravel()
        absolute = np.asarray(abs(others).sum(axis=0)).ravel()
        return float(np.sqrt(squares.max())), float(absolute.max())
    S = np.asarray(S, dtype=np.float64)
    if S.ndim != 2 or S.shape[1] == 0:
        return 0.0, 0.0
    parts = (S[: own.start], S[own.stop :])
    squares = sum((p * p).sum(axis=0) for p in parts)
    absolute = sum(np.abs(p).sum(axis=0) for p in parts)
    return float(np.sqrt(np.max(squares))), float(np.max(absolute))


@dataclass(frozen=True)
class LabelDpPlan:
    """The noise of one party's label-DP release (module docstring): its own, from its block.

    column_l2, column_l1: c₂, c₁ of the block received. rows: the rows released. scale_bits: g
    (may be negative: resolution above 1 when the columns are large). variance: μ per cell, 0 when
    no label can move the release (no column reaches a released row)."""

    epsilon: float
    delta: float
    column_l2: float
    column_l1: float
    rows: int
    scale_bits: int
    variance: float

    @property
    def scale(self) -> float:
        return 2.0**self.scale_bits

    @property
    def l2(self) -> float:
        return math.sqrt(2) * self.column_l2 * self.scale + math.sqrt(2 * self.rows)

    @property
    def l1(self) -> float:
        return 2 * self.column_l1 * self.scale + 2 * self.rows

    @property
    def rdp(self) -> tuple[float, ...]:
        """The release's RDP curve (xclp.privacy.accounting.ORDERS), which the party's ledger composes across
        runs: zero when no label can move it."""
        return skellam_curve(self.l2, self.l1, self.variance) if self.variance else (0.0,) * len(ORDERS)

    @property
    def noise_std(self) -> float:
        """σ per score, in the scores' own units."""
        return math.sqrt(self.variance) / self.scale

    @property
    def noise_multiplier(self) -> float:
        """σ over the label sensitivity √2·c₂ (0 without noise)."""
        return self.noise_std / (math.sqrt(2) * self.column_l2) if self.variance else 0.0

    def describe(self) -> str:
        if not self.variance:
            return (f"label-DP ε = {self.epsilon:g}, δ = {self.delta:g}: the influence block received reaches none "
                    "of the rows released, so no label moves the row sums and no noise is needed")
        return (f"label-DP ε = {self.epsilon:g}, δ = {self.delta:g}: noise σ = {self.noise_std:.3g} per score "
                f"(noise multiplier {self.noise_multiplier:.3g}), this party's own, calibrated to the influence "
                "block it received")


def scale_bits(column_l2: float, rows: int, frac_bits: int) -> int:
    """g: the smallest with √2·c₂·2^g >= SCALE_MARGIN·√(2r), at most frac_bits (finer than the ring
    is pointless) and at least frac_bits − MAX_SHIFT."""
    need = SCALE_MARGIN * math.sqrt(rows) / column_l2
    return max(frac_bits - MAX_SHIFT, min(frac_bits, math.ceil(math.log2(need))))


def plan(epsilon: float, delta: float, column_l2: float, column_l1: float, rows: int, frac_bits: int) -> LabelDpPlan:
    """The noise for one release of `rows` rows whose largest received column has norms (c₂, c₁);
    InvalidInput if the block needs more noise than can be drawn exactly."""
    if not math.isfinite(epsilon) or epsilon <= 0:
        raise InvalidInput(f"label_dp_epsilon must be finite and > 0, got {epsilon!r}")
    if not 0 < delta < 1:
        raise InvalidInput(f"label_dp_delta must be in (0, 1), got {delta!r}")
    for name, value in (("the largest column's L2 norm", column_l2), ("its L1 norm", column_l1)):
        if not math.isfinite(value) or value < 0:
            raise InvalidInput(f"{name} must be finite and >= 0, got {value!r}")
    if column_l2 == 0 or rows == 0:
        return LabelDpPlan(epsilon, delta, 0.0, 0.0, rows, frac_bits, 0.0)
    g = scale_bits(column_l2, rows, frac_bits)
    probe = LabelDpPlan(epsilon, delta, column_l2, column_l1, rows, g, 1.0)
    variance = skellam_variance(epsilon, delta, probe.l2, probe.l1)
    if variance is None:
        raise InvalidInput(f"label_dp_epsilon = {epsilon:g} for an influence block whose largest column has norm "
                           f"{column_l2:.3g} needs more noise than can be drawn exactly")
    return LabelDpPlan(epsilon, delta, column_l2, column_l1, rows, g, variance)


def release(Zbar: np.ndarray, plan: LabelDpPlan, frac_bits: int, limit: int) -> np.ndarray:
    """int64[r, C]: round(Z̄·2^g) + Skellam(μ) per cell, at the ring's scale 2^frac_bits (Z̄ the
    released rows). InvalidInput if a value, noise out to 40 σ included, could pass `limit` (the
    largest magnitude one summand may have in the ring)."""
    Zbar = np.asarray(Zbar, dtype=np.float64)
    if not np.all(np.isfinite(Zbar)):
        raise InvalidInput("Z̄ has NaN or infinite values")
    shift = frac_bits - plan.scale_bits
    exact = np.rint(Zbar * plan.scale)
    bound = (float(np.max(np.abs(exact), initial=0.0)) + TAIL_SIGMAS * math.sqrt(plan.variance) + 1) * 2.0**shift
    if bound > limit:
        raise InvalidInput(f"the label-DP row sums could reach {bound / 2.0**frac_bits:.3g}, beyond the fixed-point "
                           f"range {limit / 2.0**frac_bits:.3g}: lower frac_bits or raise label_dp_epsilon")
    q = exact.astype(np.int64)
    if plan.variance:
        q = q + skellam_share(plan.variance, 1, q.shape)
    return q * np.int64(2**shift)
