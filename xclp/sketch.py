"""Random sketches S ∈ R^{d×s} for DBCL (Zhang & Wang 2021 §4.2, docs/design.md §7), never materialised densely.

- **CountSketch**: row i of S has a single ±1, in column h(i); h uniform over the s columns, the
  sign uniform. (S Sᵀ)_ii = 1 and (S Sᵀ)_ij = σ_i σ_j [h(i) = h(j)], so E[S Sᵀ] = I.
- **Uniform sampling** (the dropout-equivalent baseline): s distinct coordinates chosen uniformly,
  each scaled by √(d/s); S Sᵀ is diagonal with d/s on the chosen ones, so again E[S Sᵀ] = I.

Applied as X S (float[n, d] → float[n, s]), Sᵀ W (float[d, k] → float[s, k]) and S W̃
(float[s, k] → float[d, k]) in O(nd) / O(dk) time. Every sketch comes from a seed (a round's
public seed in DBCL), so every party and the coordinator derive the same S.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from xclp.errors import InvalidInput
from xclp.seeding import Seed, public_rng

KINDS = ("countsketch", "uniform")


@dataclass(frozen=True)
class Sketch:
    """S ∈ R^{d×s} as, per input coordinate i, its column (-1: not kept) and its value."""

    d: int
    s: int
    column: np.ndarray  # int64[d], in 0..s−1, or −1 (uniform sampling: coordinate dropped)
    value: np.ndarray  # float64[d]: ±1 (CountSketch), √(d/s) or 0 (uniform)

    @classmethod
    def draw(cls, kind: str, d: int, s: int, seed: Seed, purpose: str = "sketch") -> Sketch:
        if kind not in KINDS:
            raise InvalidInput(f"sketch kind must be one of {', '.join(KINDS)}, got {kind!r}")
        if not 1 <= s <= d:
            raise InvalidInput(f"the sketch size s must be in 1..d = {d}, got {s}")
        rng = public_rng(seed, f"{purpose}/{kind}/{d}/{s}")
        if kind == "countsketch":
            column = rng.integers(0, s, size=d).astype(np.int64)
            value = rng.choice(np.array([-1.0, 1.0]), size=d)
            return cls(d, s, column, value)
        chosen = np.sort(rng.choice(d, size=s, replace=False))
        column = np.full(d, -1, dtype=np.int64)
        column[chosen] = np.arange(s)
        value = np.zeros(d)
        value[chosen] = np.sqrt(d / s)
        return cls(d, s, column, value)

    def _kept(self) -> np.ndarray:
        return np.flatnonzero(self.column >= 0)

    def right(self, X: np.ndarray) -> np.ndarray:
        """X S: float[n, d] → float64[n, s] (column j sums value_i · X[:, i] over h(i) = j)."""
        X = np.asarray(X, dtype=np.float64)
        if X.ndim != 2 or X.shape[1] != self.d:
            raise InvalidInput(f"X S needs X of shape [n, {self.d}], got {list(X.shape)}")
        kept = self._kept()
        out = np.zeros((X.shape[0], self.s))
        np.add.at(out.T, self.column[kept], (X[:, kept] * self.value[kept]).T)
        return out

    def transpose_left(self, W: np.ndarray) -> np.ndarray:
        """Sᵀ W: float[d, k] → float64[s, k] (the sketched parameters W̃)."""
        W = np.asarray(W, dtype=np.float64)
        if W.ndim != 2 or W.shape[0] != self.d:
            raise InvalidInput(f"Sᵀ W needs W of shape [{self.d}, k], got {list(W.shape)}")
        kept = self._kept()
        out = np.zeros((self.s, W.shape[1]))
        np.add.at(out, self.column[kept], W[kept] * self.value[kept, None])
        return out

    def left(self, G: np.ndarray) -> np.ndarray:
        """S G: float[s, k] → float64[d, k] (a sketched gradient back in the full space)."""
        G = np.asarray(G, dtype=np.float64)
        if G.ndim != 2 or G.shape[0] != self.s:
            raise InvalidInput(f"S G needs G of shape [{self.s}, k], got {list(G.shape)}")
        out = np.zeros((self.d, G.shape[1]))
        kept = self._kept()
        out[kept] = G[self.column[kept]] * self.value[kept, None]
        return out

    def gram_diagonal(self) -> np.ndarray:
        """diag(Sᵀ S) float64[s] (Sᵀ S is diagonal: no input coordinate has two columns): the rows
        hashed to each column (CountSketch), d/s for each kept coordinate (uniform)."""
        kept = self._kept()
        return np.bincount(self.column[kept], weights=self.value[kept] ** 2, minlength=self.s)

    def dense(self) -> np.ndarray:
        """S as a dense float64[d, s] (tests and small sizes only)."""
        out = np.zeros((self.d, self.s))
        kept = self._kept()
        out[kept, self.column[kept]] = self.value[kept]
        return out
