"""RACE: LSH count sketches for kernel sums, their merge by addition and their private release.

Paper 002 (Coleman & Shrivastava) Algorithms 1 and 2, with docs/design.md §6 fixing the details:

- R independent LSH functions l_r, each mapping into W buckets; the sketch S ∈ Z^{R×W} counts,
  per row r, how many points fell into each bucket (Alg. 1). Sketches of disjoint data sets add
  up to the sketch of their union, so the masked all-reduce of docs/design.md §6 builds the pooled sketch.
- Query (Alg. 2): S[r, l_r(q)]/N is an unbiased estimate of the KDE (1/N)·Σ_x k(x, q) for the LSH
  kernel k = collision probability (Theorem 2.5); we average the R rows, or take the
  median of group means (Lemma 3.3).
- Families: signed random projections with p bits per row (angular kernel (1 − θ/π)^p; the p
  sign bits form the bucket index, so W ≥ 2^p is required and the kernel is exact) and p-stable
  L2 LSH h = ⌊(a·x + b)/r⌋ (Datar et al.), mapped into W buckets by a seeded universal hash
  ((A·(h mod P) + B) mod P) mod W, P = 2^31 − 1, which is defined for negative h. The universal
  hash adds false collisions with probability ≈ 1/W to the L2 kernel.
- Private release: Laplace noise of scale R/ε on the raw counts (docs/design.md §6).

All hash functions derive from `public_rng(seed, "race")` so every party builds the same ones.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property
from typing import Literal

import numba
import numpy as np
from scipy.special import ndtr

from xclp.data.validation import check_features, check_labels
from xclp.errors import InvalidInput
from xclp.privacy import noise as privacy
from xclp.seeding import Seed, public_rng

Family = Literal["srp", "l2"]
Estimator = Literal["mean", "median_of_means"]

# Mersenne prime of the universal hash: A·(h mod P) + B < 2^62 never overflows int64.
_PRIME = 2**31 - 1
# Largest p for SRP: 2^p buckets per row must stay a sensible array width.
_MAX_SRP_BITS = 24


def _positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise InvalidInput(f"{name} must be a positive integer, got {value!r}")
    return int(value)


@dataclass(frozen=True)
class RaceParams:
    """RACE sketch shape and LSH family (Coleman & Shrivastava 2021 §2.4).

    rows: R repetitions. width: W buckets per row. family: "srp" (angular) or "l2" (p-stable).
    p: sign bits per row for "srp" (kernel (1 − θ/π)^p; needs width >= 2^p).
    bandwidth: bucket width r for "l2" (larger r = wider kernel).
    """

    rows: int
    width: int
    family: Family = "srp"
    p: int = 1
    bandwidth: float = 1.0

    def __post_init__(self) -> None:
        _positive_int("rows (R)", self.rows)
        _positive_int("width (W)", self.width)
        if self.family not in ("srp", "l2"):
            raise InvalidInput(f"family must be 'srp' (angular) or 'l2' (Euclidean), got {self.family!r}")
        if self.family == "srp":
            _positive_int("p (sign bits per row)", self.p)
            if self.p > _MAX_SRP_BITS:
                raise InvalidInput(f"p = {self.p} sign bits per row is too many; use p <= {_MAX_SRP_BITS}")
            if self.width < 2**self.p:
                raise InvalidInput(
                    f"width W = {self.width} cannot hold the 2^p = {2**self.p} SRP buckets; use width >= {2**self.p} "
                    f"or fewer bits p"
                )
        else:
            bw = self.bandwidth
            if isinstance(bw, bool) or not isinstance(bw, (int, float, np.integer, np.floating)):
                raise InvalidInput(f"bandwidth must be a positive number, got {bw!r}")
            if not (math.isfinite(float(bw)) and float(bw) > 0):
                raise InvalidInput(f"bandwidth r of the L2 LSH must be finite and > 0, got {bw}")
            if self.width > _PRIME:
                raise InvalidInput(f"width W = {self.width} exceeds the universal hash range {_PRIME}")


@dataclass(frozen=True, eq=False)
class RaceHashes:
    """The R LSH functions of a sketch, drawn from the common seed.

    srp: `projections` float64[p·R, d], bit-major: row j·R + r is sign bit j of LSH row r;
    offsets/mix unused.
    l2: `projections` float64[R, d] ~ N(0, 1), `offsets` float64[R] ~ U[0, r),
    `mix` int64[R, 2] = (A, B) of the universal hash, A ∈ [1, P), B ∈ [0, P).
    """

    params: RaceParams
    dim: int
    projections: np.ndarray = field(repr=False)
    offsets: np.ndarray = field(repr=False)
    mix: np.ndarray = field(repr=False)

    @classmethod
    def from_seed(cls, seed: Seed, params: RaceParams, dim: int) -> RaceHashes:
        dim = _positive_int("dim", dim)
        rng = public_rng(seed, "race")
        R = params.rows
        if params.family == "srp":
            projections = rng.standard_normal((params.p * R, dim))
            return cls(params, dim, projections, np.zeros(0), np.zeros((0, 2), dtype=np.int64))
        projections = rng.standard_normal((R, dim))
        offsets = rng.uniform(0.0, float(params.bandwidth), R)
        mix = np.stack([rng.integers(1, _PRIME, R), rng.integers(0, _PRIME, R)], axis=1).astype(np.int64)
        return cls(params, dim, projections, offsets, mix)

    def buckets(self, X: object) -> np.ndarray:
        """l_r(x) for every row x and every r: int64[n, R], values in [0, W)."""
        data = np.ascontiguousarray(check_features(X, d=self.dim))
        out = np.empty((data.shape[0], self.params.rows), dtype=np.int64)
        _buckets_kernel(data, *self._kernel_args, out, numba.get_num_threads())
        return out

    def counts(self, X: object, labels: np.ndarray | None = None, n_labels: int = 1) -> np.ndarray:
        """How many rows fall into each bucket of each row: int64[n_labels, R, W], a row counted
        in the sketch of its label (`labels` int64[n] in [0, n_labels); None: all in sketch 0).
        One pass over the rows, no [n, R] array: linear in n·R."""
        data = np.ascontiguousarray(check_features(X, d=self.dim))
        R, W = self.params.rows, self.params.width
        lab = np.zeros(data.shape[0], dtype=np.int64) if labels is None else np.ascontiguousarray(labels, np.int64)
        if lab.shape != (data.shape[0],) or (lab.size and not 0 <= lab.min() <= lab.max() < n_labels):
            # the kernel indexes the counts with them unchecked
            raise InvalidInput(f"labels must be {data.shape[0]} numbers in [0, {n_labels}), got shape {lab.shape}"
                               + (f" and values {lab.min()}..{lab.max()}" if lab.size else ""))
        counts = _counts_kernel(data, *self._kernel_args, lab, n_labels, numba.get_num_threads())
        return counts.reshape(n_labels, R, W)

    @cached_property
    def _kernel_args(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, int, int, int, float, bool]:
        """(projections transposed float64[d, p·R or R], offsets, mix, R, p, W, bandwidth, srp)."""
        srp, R = self.params.family == "srp", self.params.rows
        return (np.ascontiguousarray(self.projections.T, dtype=np.float64),
                np.zeros(R) if srp else np.ascontiguousarray(self.offsets, dtype=np.float64),
                np.zeros((R, 2), np.int64) if srp else np.ascontiguousarray(self.mix, dtype=np.int64),
                R, self.params.p if srp else 0, self.params.width, float(self.params.bandwidth), srp)


# The hashes in numba. A row's projections are x·Πᵀ summed over the d features in order, so every
# machine gets bit-identical hashes (no BLAS, whose summation order varies); four rows at a time,
# so each loaded projection serves four (the multiply-adds are the cost: p·R·d per row). Then
# SRP's p sign bits read as a binary number, or p-stable LSH ⌊(a·x + b)/r⌋ through the universal
# hash. Rows are split among the threads, each with its own buffers (and counts).
_ROWS_AT_ONCE = 4


@numba.njit(cache=True, inline="always")
def _share(n: int, threads: int) -> int:  # pragma: no cover - numba
    """Rows per thread: n / threads rounded up to a multiple of _ROWS_AT_ONCE."""
    per = (n + threads - 1) // threads
    return (per + _ROWS_AT_ONCE - 1) // _ROWS_AT_ONCE * _ROWS_AT_ONCE


@numba.njit(cache=True, inline="always")
def _project4(X: np.ndarray, lo: int, B: int, PT: np.ndarray, acc: np.ndarray) -> None:  # pragma: no cover
    """acc[b] = X[lo + b]·Πᵀ for b < B <= 4 (the other rows of acc: zero)."""
    a0, a1, a2, a3 = acc[0], acc[1], acc[2], acc[3]
    acc[:] = 0.0
    for f in range(PT.shape[0]):
        v0 = X[lo, f]
        v1 = X[lo + 1, f] if B > 1 else 0.0
        v2 = X[lo + 2, f] if B > 2 else 0.0
        v3 = X[lo + 3, f] if B > 3 else 0.0
        row = PT[f]
        for c in range(row.shape[0]):
            w = row[c]
            a0[c] += v0 * w
            a1[c] += v1 * w
            a2[c] += v2 * w
            a3[c] += v3 * w


@numba.njit(cache=True, inline="always")
def _row_buckets(proj: np.ndarray, offsets: np.ndarray, mix: np.ndarray, R: int, p: int, W: int, bandwidth: float,
                 srp: bool, out: np.ndarray) -> None:  # pragma: no cover - numba
    """out[r] = l_r(x) in [0, W) from the row's projections `proj`."""
    if srp:
        for r in range(R):
            out[r] = 0
        for j in range(p):
            for r in range(R):
                if proj[j * R + r] >= 0.0:
                    out[r] += 1 << j
    else:
        for r in range(R):
            h = np.int64(np.floor((proj[r] + offsets[r]) / bandwidth))
            out[r] = ((mix[r, 0] * (h % _PRIME) + mix[r, 1]) % _PRIME) % W


@numba.njit(cache=True, parallel=True)
def _buckets_kernel(X: np.ndarray, PT: np.ndarray, offsets: np.ndarray, mix: np.ndarray, R: int, p: int, W: int,
                    bandwidth: float, srp: bool, out: np.ndarray, threads: int) -> None:  # pragma: no cover
    n = X.shape[0]
    per = _share(n, threads)
    for t in numba.prange(threads):
        acc = np.empty((_ROWS_AT_ONCE, PT.shape[1]))
        end = min(n, (t + 1) * per)
        for lo in range(t * per, end, _ROWS_AT_ONCE):
            B = min(_ROWS_AT_ONCE, end - lo)
            _project4(X, lo, B, PT, acc)
            for b in range(B):
                _row_buckets(acc[b], offsets, mix, R, p, W, bandwidth, srp, out[lo + b])


@numba.njit(cache=True, parallel=True)
def _counts_kernel(X: np.ndarray, PT: np.ndarray, offsets: np.ndarray, mix: np.ndarray, R: int, p: int, W: int,
                   bandwidth: float, srp: bool, labels: np.ndarray, n_labels: int,
                   threads: int) -> np.ndarray:  # pragma: no cover - numba
    n = X.shape[0]
    per = _share(n, threads)
    counts = np.zeros((threads, n_labels * R * W), dtype=np.int64)
    for t in numba.prange(threads):
        acc = np.empty((_ROWS_AT_ONCE, PT.shape[1]))
        row = np.empty(R, dtype=np.int64)
        mine = counts[t]
        end = min(n, (t + 1) * per)
        for lo in range(t * per, end, _ROWS_AT_ONCE):
            B = min(_ROWS_AT_ONCE, end - lo)
            _project4(X, lo, B, PT, acc)
            for b in range(B):
                _row_buckets(acc[b], offsets, mix, R, p, W, bandwidth, srp, row)
                base = labels[lo + b] * R * W
                for r in range(R):
                    mine[base + r * W + row[r]] += 1
    return counts.sum(axis=0)


def lsh_kernel(params: RaceParams, X: object, Q: object) -> np.ndarray:
    """The exact LSH kernel k(x, q) = P[l(x) = l(q)] of one row: float64[n_q, n].

    srp: (1 − θ/π)^p with θ the angle between x and q. l2: the p-stable collision probability
    with c = ‖x − q‖, t = r/c: 1 − 2Φ(−t) − 2/(√(2π)·t)·(1 − e^{−t²/2}) (1 at c = 0), without
    the ≈1/W false collisions of the universal hash.
    """
    data = check_features(X)
    queries = check_features(Q, d=data.shape[1], name="queries")
    if params.family == "srp":
        xn = data / np.maximum(np.linalg.norm(data, axis=1, keepdims=True), 1e-300)
        qn = queries / np.maximum(np.linalg.norm(queries, axis=1, keepdims=True), 1e-300)
        theta = np.arccos(np.clip(qn @ xn.T, -1.0, 1.0))
        return (1.0 - theta / np.pi) ** params.p
    sq = (queries**2).sum(1)[:, None] + (data**2).sum(1)[None, :] - 2.0 * queries @ data.T
    dist = np.sqrt(np.maximum(sq, 0.0))
    with np.errstate(divide="ignore", invalid="ignore"):
        t = float(params.bandwidth) / dist
        k = 1.0 - 2.0 * ndtr(-t) - 2.0 / (math.sqrt(2.0 * math.pi) * t) * (1.0 - np.exp(-(t**2) / 2.0))
    return np.where(dist == 0.0, 1.0, k)


def exact_kde(params: RaceParams, X: object, Q: object) -> np.ndarray:
    """The quantity RACE estimates, (1/N)·Σ_x k(x, q): float64[n_q] (reference for tests/benchmarks)."""
    return lsh_kernel(params, X, Q).mean(axis=1)


def sketch(hashes: RaceHashes, X: object) -> np.ndarray:
    """The RACE count array (Alg. 1 without noise): int64[R, W]; additive over data splits."""
    return hashes.counts(X)[0]


def _check_sketch(hashes: RaceHashes, S: object, name: str = "sketch") -> np.ndarray:
    try:
        arr = np.asarray(S, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise InvalidInput(f"{name} must be numeric: {exc}") from None
    shape = (hashes.params.rows, hashes.params.width)
    if arr.shape[-2:] != shape:
        raise InvalidInput(f"{name} has shape {arr.shape} but these hashes need (..., {shape[0]}, {shape[1]})")
    if not np.all(np.isfinite(arr)):
        raise InvalidInput(f"{name} contains NaN/inf")
    return arr


def query(
    S: object,
    n: float | None,
    hashes: RaceHashes,
    Q: object,
    estimator: Estimator = "mean",
    groups: int | None = None,
) -> np.ndarray:
    """KDE estimates (Alg. 2): float64[n_q] from the R values S[r, l_r(q)]/N.

    n: the number of sketched points N; None uses Alg. 2's N̂ = (1/R)·Σ S (exact for a raw
    sketch, an estimate for a noisy one). estimator "mean" averages the R rows;
    "median_of_means" splits them into `groups` contiguous groups and takes the median of the
    group means (Lemma 3.3), more robust to the heavy tails of noisy sketches.
    """
    arr = _check_sketch(hashes, S)
    R = hashes.params.rows
    if n is None:
        n = float(arr.sum()) / R
    if isinstance(n, bool) or not isinstance(n, (int, float, np.integer, np.floating)) or not (
        math.isfinite(float(n)) and float(n) > 0
    ):
        raise InvalidInput(f"n (number of sketched points) must be a positive number, got {n!r}")
    values = arr[np.arange(R), hashes.buckets(Q)] / float(n)  # float64[n_q, R]
    if estimator == "mean":
        if groups is not None:
            raise InvalidInput("groups only applies to estimator='median_of_means'")
        return values.mean(axis=1)
    if estimator == "median_of_means":
        if groups is None:
            raise InvalidInput("estimator='median_of_means' needs groups (e.g. 5 to 20, at most R)")
        groups = _positive_int("groups", groups)
        if groups > R:
            raise InvalidInput(f"groups = {groups} exceeds the {R} rows of the sketch")
        means = np.stack([part.mean(axis=1) for part in np.array_split(values, groups, axis=1)], axis=1)
        return np.median(means, axis=1)
    raise InvalidInput(f"estimator must be 'mean' or 'median_of_means', got {estimator!r}")


def private_release(S: object, epsilon: float, source: np.random.Generator | None = None) -> np.ndarray:
    """ε-DP release of a raw-count sketch: S + Laplace(R/ε) per cell, float64[R, W].

    Adding or removing one point changes one cell in each of the R rows by 1, so the L1
    sensitivity of the raw counts is R (Coleman & Shrivastava 2021 Alg. 1, docs/design.md §6). The authors' code uses
    scale R/(N·ε) on raw counts — N times too little noise, not ε-DP. We do not floor the
    noisy counts as Alg. 1 does: flooring is free post-processing but biases every cell by −½.
    Noise is cryptographic unless a seeded `source` is passed (tests only).
    """
    arr = np.asarray(S, dtype=np.float64)
    R = _check_release_args(arr, epsilon)

    return arr + privacy.laplace(R / float(epsilon), arr.shape, source=source)


def private_release_share(
    S: object, epsilon: float, n_parties: int, source: np.random.Generator | None = None
) -> np.ndarray:
    """One party's distributed-DP contribution: its own sketch + a noise share, int64[R, W].

    The τ shares sum to a two-sided geometric of scale R/ε (docs/design.md §6, distributed DP), the
    integer counterpart of `private_release`, so the summed sketch is ε-DP while no party's sketch
    is ever released without noise. Each share alone is NOT an ε-DP release.
    """
    arr = np.asarray(S)
    if arr.dtype.kind not in "iu":
        raise InvalidInput(f"private_release_share needs the integer counts from sketch(), got dtype {arr.dtype}")
    R = _check_release_args(arr, epsilon)
    n_parties = _positive_int("n_parties", n_parties)

    share = privacy.discrete_laplace_share(R / float(epsilon), n_parties, arr.shape, source=source)
    return arr.astype(np.int64) + share


def _check_release_args(arr: np.ndarray, epsilon: float) -> int:
    if arr.ndim != 2 or arr.size == 0:
        raise InvalidInput(f"a RACE sketch must be a non-empty 2-D array (R x W), got shape {arr.shape}")
    if not np.all(np.isfinite(arr)) or np.any(arr < 0):
        raise InvalidInput("private_release needs the raw, non-negative counts from sketch()")
    if isinstance(epsilon, bool) or not isinstance(epsilon, (int, float, np.integer, np.floating)) or not (
        math.isfinite(float(epsilon)) and float(epsilon) > 0
    ):
        raise InvalidInput(f"epsilon must be finite and > 0, got {epsilon!r}")
    return int(arr.shape[0])


@dataclass(frozen=True, eq=False)
class RaceClassifier:
    """Max-likelihood classifier from one RACE sketch per class (Coleman & Shrivastava 2021 §5): sketches [C, R, W].

    Score of class c at q: prior × likelihood = (N_c/N)·KDE_c(q) = mean_r S_c[r, l_r(q)] / N —
    the class sizes cancel, so the prediction is the class whose sketch counts the most
    collisions with q. Ties go to the smallest class index. `sketches` may be raw int64 counts or
    released noisy ones; releasing every class sketch with `private_release(S_c, ε)` is ε-DP for
    the whole classifier (each point sits in exactly one class sketch).
    """

    hashes: RaceHashes
    sketches: np.ndarray

    def __post_init__(self) -> None:
        arr = _check_sketch(self.hashes, self.sketches, "class sketches")
        if arr.ndim != 3 or arr.shape[0] < 2:
            raise InvalidInput(f"class sketches must have shape (n_classes >= 2, R, W), got {arr.shape}")
        object.__setattr__(self, "sketches", arr)

    @classmethod
    def fit(cls, hashes: RaceHashes, X: object, y: object, n_classes: int) -> RaceClassifier:
        data = check_features(X, d=hashes.dim)
        labels = check_labels(y, n_classes, n=data.shape[0], allow_unlabeled=False)
        return cls(hashes, hashes.counts(data, labels, n_classes))

    def scores(self, Q: object) -> np.ndarray:
        """prior × KDE per class: float64[n_q, C] (N estimated as Σ S / R over all classes)."""
        R = self.hashes.params.rows
        total = max(float(self.sketches.sum()) / R, 1e-300)
        rows = np.arange(R)
        buckets = self.hashes.buckets(Q)  # int64[n_q, R]
        return np.stack([S[rows, buckets].mean(axis=1) for S in self.sketches], axis=1) / total

    def predict(self, Q: object) -> np.ndarray:
        """Most likely class per query row: int64[n_q]."""
        return np.argmax(self.scores(Q), axis=1).astype(np.int64)
