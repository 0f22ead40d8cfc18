"""FlyNN: FlyHash, Fly Bloom Filters and the federated, optionally private, count model.

Paper 001 (Ram & Sinha, AAAI 2022) Algorithms 1 and 2, with docs/design.md §6 fixing the details:

- FlyHash h(x) = Γ_ρ(M·x) (paper eq. 2): M ∈ {0,1}^{m×d} has exactly s distinct ones per row, drawn
  from `public_rng(seed, "flyhash")`; Γ_ρ keeps the ρ largest of the m projections.
- The model is the per-class count vectors c_l[i] = #{training points of class l whose hash has
  bit i}. Algorithm 1 stores FBFs w_l = γ^{c_l} instead; the counts are the log_γ of those and,
  unlike the FBFs, they are additive, so the federated model is the plain sum of the parties'
  counts (Algorithm 2 line 10, Theorem 4) — what docs/design.md §6's masked all-reduce computes.
- Inference: argmin_l w_l·h(x) (Algorithm 1 line 12), ties broken by a seeded draw.

Tie-breaking inside Γ_ρ is deterministic: when several projections equal the ρ-th largest value,
the ones with the smallest bit index win. Every party therefore computes bit-identical hashes,
which the parity contract (federated counts == pooled counts) needs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numba
import numpy as np

from xclp.data.validation import check_features, check_labels
from xclp.errors import InvalidInput
from xclp.privacy import noise as privacy
from xclp.seeding import Seed, public_rng

# Rows scored per block in `FlyNNModel.scores`, bounding the float64[rows, ρ, C] temporary.
_BLOCK_ROWS = 4096


def _check_positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise InvalidInput(f"{name} must be a positive integer, got {value!r}")
    return int(value)


@dataclass(frozen=True)
class FlyNNParams:
    """FlyNN hyper-parameters (Ram & Sinha 2022 Lemma 1; supplement Table 6 for the Digits values).

    dim: data dimension d. m: FlyHash dimension (m ≫ d, e.g. 256·d). s: ones per row of M
    (s ≤ d, e.g. ⌊0.3·d⌋). rho: bits set in each hash (ρ ≤ m). gamma: FBF decay γ ∈ [0, 1);
    γ = 0 makes the FBFs binary.
    """

    dim: int
    m: int
    s: int
    rho: int
    gamma: float = 0.0

    def __post_init__(self) -> None:
        for name in ("dim", "m", "s", "rho"):
            _check_positive_int(name, getattr(self, name))
        if self.s > self.dim:
            raise InvalidInput(f"s (ones per row of M) = {self.s} exceeds the data dimension {self.dim}; use s <= dim")
        if self.rho > self.m:
            raise InvalidInput(f"rho (bits per hash) = {self.rho} exceeds the hash dimension m = {self.m}; "
                               "use rho <= m")
        _check_gamma(self.gamma)


def _check_gamma(gamma: object) -> float:
    if isinstance(gamma, bool) or not isinstance(gamma, (int, float, np.floating, np.integer)):
        raise InvalidInput(f"gamma must be a number in [0, 1), got {gamma!r}")
    if not (0.0 <= float(gamma) < 1.0):
        raise InvalidInput(f"gamma (FBF decay) must be in [0, 1), got {gamma}; 0 gives binary filters")
    return float(gamma)


@numba.njit(cache=True)
def _sample_rows(uniforms: np.ndarray, d: int, out: np.ndarray) -> None:
    """Floyd's algorithm per row: s distinct columns of d, uniformly, from s uniforms per row."""
    m, s = uniforms.shape
    taken = np.zeros(d, dtype=np.bool_)
    for i in range(m):
        for k in range(s):
            j = d - s + k
            t = min(int(uniforms[i, k] * (j + 1)), j)
            if taken[t]:
                t = j  # j itself cannot be taken yet: earlier picks are all < j
            taken[t] = True
            out[i, k] = t
        for k in range(s):
            taken[out[i, k]] = False
        out[i].sort()


@numba.njit(cache=True, inline="always")
def _worse(values: np.ndarray, index: np.ndarray, a: int, b: int) -> bool:
    """Heap order: smaller projection first; on equal projections the larger bit index first."""
    return values[a] < values[b] or (values[a] == values[b] and index[a] > index[b])


@numba.njit(cache=True)
def _sift_down(values: np.ndarray, index: np.ndarray, pos: int, size: int) -> None:
    while True:
        child = 2 * pos + 1
        if child >= size:
            return
        if child + 1 < size and _worse(values, index, child + 1, child):
            child += 1
        if not _worse(values, index, child, pos):
            return
        values[pos], values[child] = values[child], values[pos]
        index[pos], index[child] = index[child], index[pos]
        pos = child


@numba.njit(cache=True, parallel=True)
def _winners(X: np.ndarray, indices: np.ndarray, rho: int, out: np.ndarray) -> None:
    """out[p] = sorted indices of the ρ largest entries of M·X[p] (ties: smaller index wins).

    One pass over the m projections with a size-ρ heap whose root is the current worst winner:
    O(m·s + m·log ρ) per row (Ram & Sinha 2022 Lemma 1). Bits are scanned in increasing index, so a later
    bit with a projection equal to the root's never displaces it — the documented tie rule. Each
    projection is summed in increasing column order, so every party gets bit-identical hashes.
    """
    n = X.shape[0]
    m, s = indices.shape
    for p in numba.prange(n):
        x = X[p]
        values = np.empty(rho, dtype=np.float64)
        index = np.empty(rho, dtype=np.int64)
        for i in range(m):
            acc = 0.0
            for j in range(s):
                acc += x[indices[i, j]]
            if i < rho:
                values[i] = acc
                index[i] = i
                if i == rho - 1:
                    for start in range(rho // 2 - 1, -1, -1):
                        _sift_down(values, index, start, rho)
            elif acc > values[0]:
                values[0] = acc
                index[0] = i
                _sift_down(values, index, 0, rho)
        index.sort()
        for k in range(rho):
            out[p, k] = index[k]


@dataclass(frozen=True, eq=False)
class FlyHash:
    """The FlyHash h(x) = Γ_ρ(M·x), with M stored sparsely as `indices`: int32[m, s].

    Row i of `indices` lists (ascending) the s distinct columns where M[i] is one. Build it with
    `from_seed` so every party derives the same M from the job's common seed (docs/design.md §4.3).
    """

    params: FlyNNParams
    indices: np.ndarray = field(repr=False)

    def __post_init__(self) -> None:
        p = self.params
        idx = np.asarray(self.indices)
        if idx.shape != (p.m, p.s) or idx.dtype.kind not in "iu":
            raise InvalidInput(f"FlyHash indices must be an integer array of shape ({p.m}, {p.s}), got {idx.dtype} "
                               f"{idx.shape}")
        if idx.min() < 0 or idx.max() >= p.dim:
            raise InvalidInput(f"FlyHash indices must lie in [0, {p.dim})")
        if p.s > 1 and not np.all(np.diff(idx, axis=1) > 0):
            raise InvalidInput("each row of FlyHash indices must list s distinct columns in ascending order")
        object.__setattr__(self, "indices", np.ascontiguousarray(idx, dtype=np.int32))

    @classmethod
    def from_seed(cls, seed: Seed, params: FlyNNParams) -> FlyHash:
        """Sample M (Ram & Sinha 2022 Alg. 1 line 2) from `public_rng(seed, "flyhash")`."""
        uniforms = public_rng(seed, "flyhash").random((params.m, params.s))
        indices = np.empty((params.m, params.s), dtype=np.int32)
        _sample_rows(uniforms, params.dim, indices)
        return cls(params, indices)

    def matrix(self) -> np.ndarray:
        """M as a dense uint8[m, d] (for inspection and tests; hashing never builds it)."""
        dense = np.zeros((self.params.m, self.params.dim), dtype=np.uint8)
        np.put_along_axis(dense, self.indices.astype(np.intp), 1, axis=1)
        return dense

    def active_bits(self, X: object) -> np.ndarray:
        """Indices of the set bits of h(x) per row: int32[n, ρ], ascending within a row."""
        data = check_features(X, d=self.params.dim)
        out = np.empty((data.shape[0], self.params.rho), dtype=np.int32)
        _winners(np.ascontiguousarray(data), self.indices, self.params.rho, out)
        return out

    def hash(self, X: object) -> np.ndarray:
        """h(x) for every row as bool[n, m] with exactly ρ bits set per row."""
        active = self.active_bits(X)
        bits = np.zeros((active.shape[0], self.params.m), dtype=bool)
        np.put_along_axis(bits, active.astype(np.intp), True, axis=1)
        return bits


def train_counts(flyhash: FlyHash, X: object, y: object, n_classes: int) -> np.ndarray:
    """Per-class counts c_l[i] = #{rows of class l whose hash has bit i}: uint32[C, m].

    The log_γ of Algorithm 1's FBFs; additive over any split of the rows (Theorem 4), which is
    what lets the masked all-reduce of docs/design.md §6 train the pooled model exactly.
    """
    data = check_features(X, d=flyhash.params.dim)
    labels = check_labels(y, n_classes, n=data.shape[0], allow_unlabeled=False)
    m = flyhash.params.m
    active = flyhash.active_bits(data).astype(np.int64)
    flat = (labels[:, None] * m + active).ravel()
    return np.bincount(flat, minlength=n_classes * m).astype(np.uint32).reshape(n_classes, m)


def _check_counts(counts: object) -> np.ndarray:
    try:
        arr = np.asarray(counts, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise InvalidInput(f"FlyNN counts must be numeric: {exc}") from None
    if arr.ndim != 2 or arr.shape[0] < 2:
        raise InvalidInput(f"FlyNN counts must have shape (n_classes >= 2, m), got {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise InvalidInput("FlyNN counts contain NaN/inf; a count model must be finite")
    if np.any(arr < 0):
        raise InvalidInput("FlyNN counts must be non-negative (released noisy counts are clipped at 0)")
    return arr


@dataclass(frozen=True, eq=False)
class FlyNNModel:
    """A trained FlyNN: counts float64[C, m] (exact uint32 counts or released noisy ones), γ, M.

    `counts` may be the pooled integer counts or a DP release from `privatise_counts` (float,
    non-negative, zero off the selected entries): the FBF w_l = γ^{c_l} is defined for real c.
    `gamma` only enters inference, so one set of counts serves every γ.
    """

    counts: np.ndarray
    gamma: float
    flyhash: FlyHash

    def __post_init__(self) -> None:
        arr = _check_counts(self.counts)
        if arr.shape[1] != self.flyhash.params.m:
            raise InvalidInput(f"FlyNN counts have {arr.shape[1]} columns but the FlyHash has m = "
                               f"{self.flyhash.params.m}")
        object.__setattr__(self, "counts", arr)
        object.__setattr__(self, "gamma", _check_gamma(self.gamma))

    @classmethod
    def train(cls, flyhash: FlyHash, X: object, y: object, n_classes: int) -> FlyNNModel:
        """Train on one data set (Algorithm 1) with the γ of `flyhash.params`."""
        return cls(train_counts(flyhash, X, y, n_classes), flyhash.params.gamma, flyhash)

    @property
    def n_classes(self) -> int:
        return int(self.counts.shape[0])

    def filters(self) -> np.ndarray:
        """The FBFs w_l = γ^{c_l}: float64[C, m]; for γ = 0, w = 1 where c = 0 and 0 elsewhere."""
        if self.gamma == 0.0:
            return (self.counts == 0).astype(np.float64)
        return np.power(self.gamma, self.counts)

    def scores(self, X: object) -> np.ndarray:
        """Novelty scores w_l·h(x) (Algorithm 1 line 12): float64[n, C]; lower = more familiar."""
        active = self.flyhash.active_bits(X)
        filters_t = self.filters().T  # float64[m, C]
        out = np.empty((active.shape[0], self.n_classes), dtype=np.float64)
        for start in range(0, active.shape[0], _BLOCK_ROWS):
            block = active[start : start + _BLOCK_ROWS]
            out[start : start + _BLOCK_ROWS] = filters_t[block].sum(axis=1)
        return out

    def predict(self, X: object, tie_seed: Seed) -> np.ndarray:
        """argmin_l w_l·h(x) per row: int64[n]; exact ties go to a uniform seeded draw.

        The draw comes from `public_rng(tie_seed, "flynn-ties")`: one uniform key per (row, class),
        the tied class with the smallest key wins — reproducible for a given batch and seed.
        """
        scores = self.scores(X)
        keys = public_rng(tie_seed, "flynn-ties").random(scores.shape)
        tied = scores == scores.min(axis=1, keepdims=True)
        return np.argmin(np.where(tied, keys, np.inf), axis=1).astype(np.int64)


def privatise_counts(
    counts: object,
    epsilon: float,
    T: int,
    n_parties: int,
    source: np.random.Generator | None = None,
    *,
    discrete: bool = False,
) -> np.ndarray:
    """One party's ε-DP release of its counts (Ram & Sinha 2022 Alg. 2 lines 13–25, docs/design.md §6).

    Our reading of the paper: the mechanism acts on ONE vector per party — the party's own counts
    of all classes concatenated (m·L entries, Alg. 2 line 14), not per class — with the budget
    split evenly over the τ parties (ε/τ each, line 6). Inside a party:
    - T distinct entries are chosen one after another by the exponential mechanism with
      P(i) ∝ exp(ε c[i] / (4 T τ)) (line 18 with ε/τ: ε₀ = ε/(2Tτ) per pick, utility sensitivity 1,
      hence ε₀/2 in the exponent). The authors' code uses exp(ε c/(2Tτ)), which spends twice the
      budget the proof (supplement C.3) accounts for; we follow the paper. Picks are without
      replacement (the "largest T indices selected iteratively" of the text): with replacement
      an entry could be noised twice and the proof's per-pick accounting would not hold.
    - each chosen entry gets Laplace(2Tτ/ε) noise (line 19, scale 1/ε₀) and is clipped at 0;
    - every other entry is set to 0 (line 22), i.e. FBF weight γ⁰ = 1, "never seen".
    Each pick plus its noisy value costs 2ε₀ = ε/(Tτ); T picks on τ parties compose to ε.

    Returns the released model share: float64[C, m], non-negative, at most T non-zero entries.
    Summing the parties' releases gives the DP federated counts (Alg. 2 line 10 in log space),
    which `FlyNNModel` accepts as they are. With `discrete=True` the noise is a two-sided
    geometric with the same scale (ε₀-DP for integer counts of sensitivity 1) and the result is
    int64, so it fits the integer masked all-reduce of docs/design.md §6 unchanged.

    Noise is cryptographic unless a seeded `source` Generator is passed (tests only).
    """
    arr = _check_counts(counts)
    if not np.all(arr == np.round(arr)):
        raise InvalidInput("privatise_counts needs the party's exact integer counts from train_counts")
    if isinstance(epsilon, bool) or not isinstance(epsilon, (int, float, np.floating, np.integer)):
        raise InvalidInput(f"epsilon must be a positive number, got {epsilon!r}")
    if not (math.isfinite(float(epsilon)) and float(epsilon) > 0):
        raise InvalidInput(f"epsilon (total privacy budget) must be finite and > 0, got {epsilon}")
    T = _check_positive_int("T (entries released per party)", T)
    n_parties = _check_positive_int("n_parties", n_parties)
    if arr.size < T:
        raise InvalidInput(f"T = {T} exceeds the {arr.size} count entries (n_classes x m); use T <= {arr.size}")

    flat = arr.ravel()
    chosen = privacy.exponential_mechanism_select(flat, float(epsilon) / (4.0 * T * n_parties), T, source=source)
    scale = 2.0 * T * n_parties / float(epsilon)
    released = np.zeros(flat.shape, dtype=np.int64 if discrete else np.float64)
    if discrete:
        noisy = flat[chosen].astype(np.int64) + privacy.discrete_laplace(scale, (T,), source=source)
    else:
        noisy = flat[chosen] + privacy.laplace(scale, (T,), source=source)
    released[chosen] = np.maximum(noisy, 0)
    return released.reshape(arr.shape)
