"""Differential-privacy noise: Laplace, discrete Laplace and Skellam with their distributed shares,
exponential mechanism.

Used by FlyNN's per-party DP training and RACE's private release (docs/design.md §6).

Randomness: by default every draw starts from cryptographic uniforms — 53 random bits from
`os.urandom` per double, u = (k + ½)·2^−53 ∈ (0, 1) (never 0 or 1, so logarithms are finite) —
transformed by inverse CDFs. Tests pass `source=` a numpy Generator to get reproducible draws from
the same transforms (it supplies the 53-bit integers instead). numpy's global state is never used.

Caveat (Mironov 2012): floating-point Laplace noise leaks through the set of representable
outputs. Integer data (counts) should use `discrete_laplace` / `discrete_laplace_share`, whose
outputs are integers.
"""

from __future__ import annotations

import math
import os
from typing import Any

import numpy as np
from scipy import special, stats

from xclp.errors import InvalidInput

Shape = int | tuple[int, ...]
_MANTISSA_BITS = 53
# −log(u) <= 53·ln 2 + ln 2 ≈ 37.4 for our uniforms, so an integer sample is at most ~37.4·scale;
# keep that well inside int64.
_MAX_SCALE = 2.0**56


def uniform_open(shape: Shape, *, source: np.random.Generator | None = None) -> np.ndarray:
    """float64[shape] uniforms in the open interval (0, 1), on the 2^−53 grid shifted by half a step."""
    dims = _check_shape(shape)
    n = math.prod(dims)
    if source is None:
        k = np.frombuffer(os.urandom(8 * n), dtype="<u8") >> np.uint64(64 - _MANTISSA_BITS)
    elif isinstance(source, np.random.Generator):
        k = source.integers(0, 2**_MANTISSA_BITS, size=n, dtype=np.uint64)
    else:
        raise InvalidInput(f"source must be a numpy Generator or None (OS CSPRNG), got {type(source).__name__}")
    return ((k.astype(np.float64) + 0.5) * 2.0**-_MANTISSA_BITS).reshape(dims)


def laplace(scale: float, shape: Shape, *, source: np.random.Generator | None = None) -> np.ndarray:
    """float64[shape] i.i.d. Laplace(0, scale): density exp(−|x|/scale) / (2·scale).

    Drawn as scale·(E1 − E2) with E = −log u standard exponentials; the difference of two i.i.d.
    exponentials is exactly Laplace and avoids the cancellation of the one-uniform inverse CDF.
    """
    b = _check_scale(scale)
    dims = _check_shape(shape)
    u = uniform_open((2, *dims), source=source)
    return b * (np.log(u[1]) - np.log(u[0]))


def discrete_laplace(scale: float, shape: Shape, *, source: np.random.Generator | None = None) -> np.ndarray:
    """int64[shape] two-sided geometric noise: P(k) = (1 − q)/(1 + q) · q^|k|, q = exp(−1/scale).

    The difference of two i.i.d. geometrics G with P(G = g) = (1 − q) q^g. Each G is the inverse
    CDF ⌊scale · (−log u)⌋, since P(G >= g) = P(u <= q^g) = q^g exactly.
    """
    b = _check_scale(scale)
    dims = _check_shape(shape)
    u = uniform_open((2, *dims), source=source)
    g = np.floor(-b * np.log(u)).astype(np.int64)
    return g[0] - g[1]


def discrete_laplace_share(
    scale: float, n_parties: int, shape: Shape, *, source: np.random.Generator | None = None
) -> np.ndarray:
    """int64[shape]: one of `n_parties` = τ shares, sized so that ANY τ − 1 of them already sum to
    exactly `discrete_laplace(scale)` (docs/design.md §6).

    Share = NB(1/(τ−1), p) − NB(1/(τ−1), p) with p = 1 − exp(−1/scale) (NB counts failures before
    the r-th success). NB is infinitely divisible: a sum of τ − 1 i.i.d. NB(1/(τ−1), p) is NB(1, p),
    the geometric above. So the released sum is ε-DP against the coordinator, and a party that
    subtracts its own share still sees an ε-DP view of the others; the price is τ/(τ−1) times the
    minimum noise. (Sized for all τ, as before, a party subtracting its own share was left with
    (τ−1)/τ of the noise: effective ε = 12.5 for ε = 1, τ = 3.) With τ = 1 the one share is the
    whole noise. Each NB draw is an exact inverse-CDF sample,
    `scipy.stats.nbinom.ppf(u)` of a cryptographic uniform — one uniform per draw, no rejection
    loop (a Poisson–Gamma mixture would need two inverse CDFs per draw for the same law).
    """
    b = _check_scale(scale)
    if isinstance(n_parties, bool) or not isinstance(n_parties, (int, np.integer)) or n_parties < 1:
        raise InvalidInput(f"n_parties must be an integer >= 1, got {n_parties!r}")
    dims = _check_shape(shape)
    p = -math.expm1(-1.0 / b)  # 1 − exp(−1/scale), accurate for large scale
    u = uniform_open((2, *dims), source=source)
    nb = stats.nbinom.ppf(u, 1.0 / max(int(n_parties) - 1, 1), p).astype(np.int64)
    return nb[0] - nb[1]


def skellam_share(
    variance: float, n_parties: int, shape: Shape, *, source: np.random.Generator | None = None
) -> np.ndarray:
    """int64[shape]: one of `n_parties` = τ shares of symmetric Skellam noise, sized so that ANY
    τ − 1 of them already sum to exactly Skellam of `variance` per cell (the DP sums of
    DBCL and FedAvg).

    Share = Poisson(λ) − Poisson(λ), λ = variance / (2(τ − 1)). Poisson is infinitely divisible,
    so τ − 1 i.i.d. shares sum to Poisson(variance/2) − Poisson(variance/2): the Skellam mechanism
    of Agarwal, Kairouz and Liu (2021), whose Rényi DP `xclp.privacy.accounting` composes. As with
    `discrete_laplace_share`, a party that subtracts its own share from the sum still sees the
    whole noise; all τ shares carry τ/(τ − 1) of it. With τ = 1 the one share is the whole noise.
    Each Poisson draw is exact (`poisson`).
    """
    v = _check_scale(variance)
    if isinstance(n_parties, bool) or not isinstance(n_parties, (int, np.integer)) or n_parties < 1:
        raise InvalidInput(f"n_parties must be an integer >= 1, got {n_parties!r}")
    dims = _check_shape(shape)
    lam = v / (2.0 * max(int(n_parties) - 1, 1))
    draws = poisson(lam, (2, *dims), source=source)
    return draws[0] - draws[1]


def poisson(lam: float, shape: Shape, *, source: np.random.Generator | None = None) -> np.ndarray:
    """int64[shape] i.i.d. Poisson(λ) from cryptographic uniforms (or `source`), exact for every λ.

    λ < 10: the inverse CDF, `scipy.stats.poisson.ppf(u)`. λ >= 10: Hörmann's transformed
    rejection (PTRS, "The transformed rejection method for generating Poisson random variables",
    1993; numpy's own algorithm), vectorised: every cell draws a pair of uniforms until one is
    accepted (over 90 % are at the first pair). The inverse CDF takes minutes for 10⁵ draws at
    λ = 10⁸ and returns NaN beyond; the DP sums of the training jobs need λ up to 2^49.
    """
    lam = float(lam)
    if not math.isfinite(lam) or lam < 0 or lam > _MAX_SCALE:
        raise InvalidInput(f"the Poisson mean must be finite, >= 0 and at most 2^56, got {lam!r}")
    dims = _check_shape(shape)
    n = math.prod(dims)
    if lam < 10.0:
        return stats.poisson.ppf(uniform_open(n, source=source), lam).astype(np.int64).reshape(dims)
    slam, loglam = math.sqrt(lam), math.log(lam)
    b = 0.931 + 2.53 * slam
    a = -0.059 + 0.02483 * b
    log_invalpha = math.log(1.1239 + 1.1328 / (b - 3.4))
    vr = 0.9277 - 3.6224 / (b - 2)
    out = np.empty(n, dtype=np.int64)
    todo = np.arange(n)
    while todo.size:
        uv = uniform_open((2, todo.size), source=source)
        U, V = uv[0] - 0.5, uv[1]
        us = 0.5 - np.abs(U)
        k = np.floor((2 * a / us + b) * U + lam + 0.43)
        quick = (us >= 0.07) & (vr >= V)
        possible = ~quick & (k >= 0) & ~((us < 0.013) & (us < V))
        with np.errstate(invalid="ignore", divide="ignore"):
            slow = possible & (np.log(V) + log_invalpha - np.log(a / (us * us) + b) <= _log_pmf(k, lam, loglam))
        accepted = quick | slow
        out[todo[accepted]] = k[accepted].astype(np.int64)
        todo = todo[~accepted]
    return out.reshape(dims)


def _log_pmf(k: np.ndarray, lam: float, loglam: float) -> np.ndarray:
    """log P(Poisson(λ) = k) = −λ + k log λ − log k!, for float k >= 0 (others: anything).

    Written naively its three terms are each ~λ log λ and their difference O(1): at λ = 2^49 the
    rounding error is ~2, which skewed the variance of PTRS draws by 8 %. For k >= 10 Stirling's
    series gives it as (k − λ) − k·log1p((k − λ)/λ) − ½ log(2πk) − (1/12k − 1/360k³ + 1/1260k⁵),
    whose first two terms cancel exactly in closed form (error of the series < 10⁻¹⁰)."""
    k = np.maximum(k, 0.0)
    big = np.maximum(k, 10.0)
    d = big - lam
    inv = 1.0 / big
    stirling = (d - big * np.log1p(d / lam) - 0.5 * np.log(2 * math.pi * big)
                - inv * (1 / 12 - inv * inv * (1 / 360 - inv * inv / 1260)))
    return np.where(k >= 10.0, stirling, -lam + k * loglam - special.gammaln(k + 1))


def exponential_mechanism_select(
    scores: np.ndarray, epsilon_per_unit: float, count: int, *, source: np.random.Generator | None = None
) -> np.ndarray:
    """int64[count] distinct indices of float[m] `scores`, picked one after another without
    replacement, each time with probability ∝ exp(epsilon_per_unit · score) among those left.

    FlyNN's DP step (Ram & Sinha 2022 Alg. 1 lines 15-18; docs/design.md §6) passes epsilon_per_unit = ε/(4Tτ).
    Gumbel-top-k: adding i.i.d. Gumbel(0, 1) noise to epsilon_per_unit·score and taking the
    `count` largest in decreasing order has exactly the law of the sequential mechanism, and needs
    no exponentials of large scores (the log-sum-exp problem disappears).
    """
    s = _check_scores(scores)
    if isinstance(epsilon_per_unit, bool) or not isinstance(epsilon_per_unit, (int, float, np.floating, np.integer)):
        raise InvalidInput(f"epsilon_per_unit must be a number, got {epsilon_per_unit!r}")
    eps = float(epsilon_per_unit)
    if not math.isfinite(eps) or eps < 0:
        raise InvalidInput(f"epsilon_per_unit must be finite and >= 0, got {epsilon_per_unit!r}")
    if isinstance(count, bool) or not isinstance(count, (int, np.integer)) or not 0 <= count <= s.size:
        raise InvalidInput(f"count must be an integer in [0, {s.size}] (the number of scores), got {count!r}")
    gumbel = -np.log(-np.log(uniform_open(s.size, source=source)))
    with np.errstate(over="ignore"):
        keys = eps * s + gumbel
    if not np.all(np.isfinite(keys)):
        raise InvalidInput("epsilon_per_unit * scores overflows float64; rescale the scores")
    order = np.argsort(-keys, kind="stable")
    return order[: int(count)].astype(np.int64)


def _check_scale(scale: Any) -> float:
    if isinstance(scale, bool) or not isinstance(scale, (int, float, np.floating, np.integer)):
        raise InvalidInput(f"noise scale must be a number, got {scale!r}")
    b = float(scale)
    if not math.isfinite(b) or b <= 0:
        raise InvalidInput(f"noise scale must be finite and > 0, got {scale!r}")
    if b > _MAX_SCALE:
        raise InvalidInput(f"noise scale {b:g} is too large (max 2^56); check sensitivity/epsilon")
    return b


def _check_shape(shape: Shape) -> tuple[int, ...]:
    dims = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
    for d in dims:
        if isinstance(d, bool) or not isinstance(d, (int, np.integer)) or d < 0:
            raise InvalidInput(f"shape must be non-negative integers, got {shape!r}")
    return tuple(int(d) for d in dims)


def _check_scores(scores: Any) -> np.ndarray:
    try:
        s = np.asarray(scores, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise InvalidInput(f"scores must be numeric: {exc}") from None
    if s.ndim != 1 or s.size == 0:
        raise InvalidInput(f"scores must be a non-empty 1-D array, got shape {s.shape}")
    if not np.all(np.isfinite(s)):
        raise InvalidInput("scores contain NaN/inf")
    return s
