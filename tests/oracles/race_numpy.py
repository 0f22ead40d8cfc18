"""RACE hashing and counting as plain numpy did it before the numba kernels (xclp/race.py): the
projections by one BLAS matrix product per block, the buckets as an int64[n, R] array, the counts
by np.bincount. The oracle of tests/xclp/test_race.py (the kernels must give the same buckets and
counts) and the baseline of benchmarks/race_kde.py (whose time grew faster than R)."""

from __future__ import annotations

import numpy as np

from xclp.race import _PRIME, RaceHashes

BLOCK_ENTRIES = 1 << 20  # floats held at once while hashing (rows × projections)


def buckets_numpy(hashes: RaceHashes, X: np.ndarray) -> np.ndarray:
    """l_r(x) for every row and every r: int64[n, R]."""
    R, p = hashes.params.rows, hashes.params.p
    out = np.empty((X.shape[0], R), dtype=np.int64)
    block = max(1, BLOCK_ENTRIES // hashes.projections.shape[0])
    for start in range(0, X.shape[0], block):
        data = X[start: start + block]
        proj = data @ hashes.projections.T
        if hashes.params.family == "srp":
            index = np.zeros((data.shape[0], R), dtype=np.int64)
            for j in range(p):
                index |= (proj[:, j * R: (j + 1) * R] >= 0).astype(np.int64) << j
            out[start: start + block] = index
        else:
            h = np.floor((proj + hashes.offsets) / float(hashes.params.bandwidth)).astype(np.int64)
            a, b = hashes.mix[:, 0], hashes.mix[:, 1]
            out[start: start + block] = ((a * np.mod(h, _PRIME) + b) % _PRIME) % hashes.params.width
    return out


def counts_numpy(hashes: RaceHashes, X: np.ndarray, labels: np.ndarray | None = None,
                 n_labels: int = 1) -> np.ndarray:
    """int64[n_labels, R, W]: each row counted in its label's sketch."""
    R, W = hashes.params.rows, hashes.params.width
    lab = np.zeros(X.shape[0], dtype=np.int64) if labels is None else labels
    flat = (lab[:, None] * (R * W) + np.arange(R, dtype=np.int64) * W + buckets_numpy(hashes, X)).ravel()
    return np.bincount(flat, minlength=n_labels * R * W).astype(np.int64).reshape(n_labels, R, W)
