"""Privacy spent over rounds: the Rényi DP of the Skellam mechanism, composed over a
job's releases and converted to (ε, δ) by Google's `dp-accounting`.

The Skellam mechanism (Agarwal, Kairouz and Liu, "The Skellam Mechanism for Differentially
Private Federated Learning", NeurIPS 2021, Theorem 3.5 with unit scale) adds symmetric Skellam
noise of variance μ to each cell of an integer vector whose neighbouring values differ by at most
Δ₂ in L2 and Δ₁ in L1. For every integer order α > 1 it is (α, ε(α))-RDP with

    ε(α) = α Δ₂² / (2μ) + min( ((2α − 1) Δ₂² + 6 Δ₁) / (4 μ²),  3 Δ₁ / (2μ) ):

the Gaussian mechanism's α Δ₂²/(2μ) plus a term that vanishes as μ grows. RDP adds up over
releases; `dp_accounting.rdp.compute_epsilon` converts the sum to ε at the job's δ (the tight
conversion of Balle et al. 2020 that its RDP accountant uses).

No amplification by sampling is claimed here: which parties take part in a round is public (the
common seed draws it), and the rows of a batch are the party's own to draw, but the subsampled
Skellam mechanism has no bound in the library. Every release is charged in full.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from xclp.errors import InvalidInput

ORDERS = tuple(range(2, 64)) + tuple(range(64, 1025, 8))  # integer orders, as the bound needs


def skellam_rdp(alpha: int, l2: float, l1: float, variance: float) -> float:
    """ε(α) of one Skellam release (module docstring), for integer α > 1."""
    if isinstance(alpha, bool) or not isinstance(alpha, int) or alpha < 2:
        raise InvalidInput(f"the Skellam bound holds for integer orders alpha >= 2, got {alpha!r}")
    for name, value in (("l2", l2), ("l1", l1), ("variance", variance)):
        if not math.isfinite(value) or value <= 0:
            raise InvalidInput(f"{name} must be finite and > 0, got {value!r}")
    if l1 < l2:
        raise InvalidInput(f"an L1 sensitivity ({l1}) below the L2 one ({l2}) is impossible")
    gaussian = alpha * l2 * l2 / (2 * variance)
    return gaussian + min(((2 * alpha - 1) * l2 * l2 + 6 * l1) / (4 * variance**2), 3 * l1 / (2 * variance))


def skellam_epsilon(releases: Sequence[tuple[float, float, float]], delta: float) -> tuple[float, int]:
    """(ε, the order that gave it) of the composition of Skellam releases [(Δ₂, Δ₁, μ), ...] at δ."""
    counted = [(1, l2, l1, mu) for l2, l1, mu in releases]
    return _epsilon(counted, delta)


def repeated_skellam_epsilon(count: int, l2: float, l1: float, variance: float, delta: float) -> tuple[float, int]:
    """(ε, order) of `count` identical Skellam releases at δ (a training job's rounds)."""
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise InvalidInput(f"the number of releases must be an integer >= 0, got {count!r}")
    return _epsilon([(count, l2, l1, variance)] if count else [], delta)


def _epsilon(releases: Sequence[tuple[int, float, float, float]], delta: float) -> tuple[float, int]:
    if not 0 < delta < 1:
        raise InvalidInput(f"delta must be in (0, 1), got {delta!r}")
    if not releases:
        return 0.0, ORDERS[0]
    from dp_accounting.rdp import compute_epsilon  # the well-kept conversion (pyproject: dp-accounting)

    rdp = [sum(n * skellam_rdp(a, l2, l1, mu) for n, l2, l1, mu in releases) for a in ORDERS]
    epsilon, order = compute_epsilon(ORDERS, rdp, delta)
    return float(epsilon), int(order)


MAX_VARIANCE = 2.0**50  # Skellam draws stay exact in float64 (2^53) with room for the tails


def skellam_variance(epsilon: float, delta: float, l2: float, l1: float, releases: int = 1) -> float | None:
    """The smallest Skellam variance μ per cell whose `releases` identical releases of sensitivity
    (Δ₂, Δ₁) compose to at most (ε, δ), to 10⁻⁶ relative (bisection on log μ; ε(μ) falls as μ
    grows); None if it is above MAX_VARIANCE, where draws are no longer exact."""
    if not math.isfinite(epsilon) or epsilon <= 0:
        raise InvalidInput(f"epsilon must be finite and > 0, got {epsilon!r}")

    def spent(variance: float) -> float:
        return repeated_skellam_epsilon(releases, l2, l1, variance, delta)[0]

    low = high = l2 * l2  # noise multiplier ~1
    while spent(high) > epsilon:
        low, high = high, high * 4
        if high > MAX_VARIANCE:
            return None
    while low > 1e-300 and spent(low) <= epsilon:
        low /= 4
    while high / low > 1 + 1e-6:
        middle = math.sqrt(low * high)
        low, high = (low, middle) if spent(middle) <= epsilon else (middle, high)
    return high


# --- RDP curves, for composing releases across runs (client/ledger.py) ---------------------------------


def pure_rdp(epsilon: float) -> tuple[float, ...]:
    """The RDP curve over ORDERS of a pure ε-DP release: (α, min(ε, α ε²/2)) — ε-DP is (α, ε)-RDP
    at every order, and ε²/2-zCDP (Bun and Steinke, "Concentrated Differential Privacy", TCC 2016,
    Proposition 1.4), which is (α, α ε²/2)-RDP."""
    if not math.isfinite(epsilon) or epsilon <= 0:
        raise InvalidInput(f"epsilon must be finite and > 0, got {epsilon!r}")
    return tuple(min(epsilon, a * epsilon * epsilon / 2) for a in ORDERS)


def skellam_curve(l2: float, l1: float, variance: float, count: int = 1) -> tuple[float, ...]:
    """The RDP curve over ORDERS of `count` identical Skellam releases (module docstring)."""
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise InvalidInput(f"the number of releases must be an integer >= 1, got {count!r}")
    return tuple(count * skellam_rdp(a, l2, l1, variance) for a in ORDERS)


def composed_epsilon(curves: Sequence[Sequence[float]], delta: float) -> float:
    """ε at δ of releases whose RDP curves over ORDERS are `curves`: RDP adds up, and
    dp-accounting converts the sum."""
    if not 0 < delta < 1:
        raise InvalidInput(f"delta must be in (0, 1), got {delta!r}")
    if not curves:
        return 0.0
    if any(len(c) != len(ORDERS) for c in curves):
        raise InvalidInput(f"an RDP curve has one value per order: {len(ORDERS)}")
    from dp_accounting.rdp import compute_epsilon

    epsilon, _ = compute_epsilon(ORDERS, [math.fsum(c[i] for c in curves) for i in range(len(ORDERS))], delta)
    return float(epsilon)
