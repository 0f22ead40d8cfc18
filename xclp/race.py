"""RACE: LSH count sketches for kernel sums, their merge by addition and their private release.

Paper 002 (Coleman & Shrivastava) Algorithms 1 and 2, with DESIGN §6 fixing the details:

- R independent LSH functions l_r, each mapping into W buckets; the sketch S ∈ Z^{R×W} counts,
  per row r, how many points fell into each bucket (Alg. 1). Sketches of disjoint data sets add
  up to the sketch of their union, so the masked all-reduce of DESIGN §6 builds the pooled sketch.
- Query (Alg. 2): S[r, l_r(q)]/N is an unbiased estimate of the KDE (1/N)·Σ_x k(x, q) for the LSH
  kernel k = collision probability (Theorem 2.5); we average the R rows, or take the
  median of group means (Lemma 3.3).
- Families: signed random projections with p bits per row (angular kernel (1 − θ/π)^p; the p
  sign bits form the bucket index, so W ≥ 2^p is required and the kernel is exact) and p-stable
  L2 LSH h = ⌊(a·x + b)/r⌋ (Datar et al.), mapped into W buckets by a seeded universal hash
  ((A·(h mod P) + B) mod P) mod W, P = 2^31 − 1, which is defined for negative h. The universal
  hash adds false collisions with probability ≈ 1/W to the L2 kernel.
- Private release: Laplace noise of scale R/ε on the raw counts (DESIGN §6).

All hash functions derive from `public_rng(seed, "race")` so every party builds the same ones.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
from scipy.special import ndtr

from xclp import privacy
from xclp.errors import InvalidInput
from xclp.seeding import Seed, public_rng
from xclp.validation import check_features, check_labels

Family = Literal["srp", "l2"]
Estimator = Literal["mean", "median_of_means"]

# Mersenne prime of the universal hash: A·(h mod P) + B < 2^62 never overflows int64.
_PRIME = 2**31 - 1
# Largest p for SRP: 2^p buckets per row must stay a sensible array width.
_MAX_SRP_BITS = 24
# Bound on floats held at once while hashing (rows × projections).
_BLOCK_ENTRIES = 1 << 20


def _positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise InvalidInput(f"{name} must be a positive integer, got {value!r}")
    return int(value)


@dataclass(frozen=True)
class RaceParams:
    """RACE sketch shape and LSH family (paper 002 §2.4).

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
        data = check_features(X, d=self.dim)
        R = self.params.rows
        out = np.empty((data.shape[0], R), dtype=np.int64)
        block = max(1, _BLOCK_ENTRIES // self.projections.shape[0])
        for start in range(0, data.shape[0], block):
            out[start : start + block] = self._bucket_block(data[start : start + block])
        return out

    def _bucket_block(self, data: np.ndarray) -> np.ndarray:
        proj = data @ self.projections.T
        if self.params.family == "srp":
            # SRP: bit j of row r is [π_{j,r}·x ≥ 0]; the p bits read as a binary number.
            R = self.params.rows
            index = np.zeros((data.shape[0], R), dtype=np.uint8 if self.params.p <= 8 else np.uint32)
            for j in range(self.params.p):
                index |= (proj[:, j * R : (j + 1) * R] >= 0).astype(index.dtype) << j
            return index.astype(np.int64)
        # p-stable LSH (Datar et al.): h = ⌊(a·x + b)/r⌋, any sign; np.mod makes it non-negative.
        h = np.floor((proj + self.offsets) / float(self.params.bandwidth)).astype(np.int64)
        a, b = self.mix[:, 0], self.mix[:, 1]
        return ((a * np.mod(h, _PRIME) + b) % _PRIME) % self.params.width


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
    R, W = hashes.params.rows, hashes.params.width
    flat = (hashes.buckets(X) + np.arange(R, dtype=np.int64) * W).ravel()
    return np.bincount(flat, minlength=R * W).astype(np.int64).reshape(R, W)


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
    sensitivity of the raw counts is R (paper 002 Alg. 1, DESIGN §6). The authors' code uses
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

    The τ shares sum to a two-sided geometric of scale R/ε (DESIGN §6, distributed DP), the
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
    """Max-likelihood classifier from one RACE sketch per class (paper 002 §5): sketches [C, R, W].

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
        R, W = hashes.params.rows, hashes.params.width
        flat = (labels[:, None] * (R * W) + np.arange(R, dtype=np.int64) * W + hashes.buckets(data)).ravel()
        counts = np.bincount(flat, minlength=n_classes * R * W).astype(np.int64)
        return cls(hashes, counts.reshape(n_classes, R, W))

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
