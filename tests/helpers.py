"""Helpers several test modules share: key files as the CLIs write and read them, party data,
and party tables as CSV."""

from __future__ import annotations

import csv
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import scipy.sparse as sp
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from xclp.crypto import identity
from xclp.data.party_table import PartyData
from xclp.graph import GraphParams, knn_adjacency
from xclp.hamming import hamming_matrix
from xclp.lsh import lsh_codes, lsh_projection
from xclp.runtime import read_bytes, read_toml, write_private


def save_identity(key: Ed25519PrivateKey, path: Path) -> Path:
    return write_private(path, identity.private_key_pem(key), overwrite=True)


def load_identity(path: Path) -> Ed25519PrivateKey:
    return identity.load_private_key(read_bytes(path, "identity key"), source=str(path))


def load_allow_list(path: Path) -> Mapping[str, bytes]:
    return identity.allow_list(read_toml(path).get("parties"), source=str(path))


def deployment(root: Path, parties: Sequence[str]) -> dict[str, bytes]:
    """What a real-process test needs under `root`: a dev CA and the coordinator's certificate
    (ca/, certs/), each party's identity key (keys/<party>.key) and allow.toml; returns the allow-list."""
    from xclp.server import dev_ca  # the server's certificate helper: only tests that run a coordinator

    dev_ca.init_ca(root / "ca")
    dev_ca.issue(root / "ca", root / "certs", "server", server=True, dns_names=("localhost",), ips=("127.0.0.1",))
    (root / "keys").mkdir()
    keys = {p: identity.generate_identity() for p in parties}
    for p, key in keys.items():
        save_identity(key, root / "keys" / f"{p}.key")
    (root / "allow.toml").write_text("[parties]\n" + "".join(
        f'{p} = "{identity.public_key_text(key)}"\n' for p, key in keys.items()))
    return {p: identity.public_bytes(key) for p, key in keys.items()}


def make_data(seed: int, n: int = 50, d: int = 8, *, unlabeled: int = 4) -> tuple[np.ndarray, np.ndarray]:
    """Three classes shifted along the first three of `d` features; the first `unlabeled` rows -1."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 3, size=n)
    X = rng.normal(size=(n, d)) + 2.0 * np.eye(3, d)[y]
    y[:unlabeled] = -1
    return X, y


def blobs(seed: int, n: int = 40, labeled: int = 8, *, n_classes: int = 3, d: int = 6) -> PartyData:
    """Three Gaussian classes in `d` dimensions around centres shared by every seed, the first
    `labeled` rows labeled (the training jobs' data)."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, n_classes, n)
    centres = np.random.default_rng(99).normal(0, 3, size=(n_classes, d))
    X = centres[y] + rng.normal(size=(n, d))
    y_partial = np.where(np.arange(n) < labeled, y, -1)
    return PartyData(X, y_partial, tuple(f"r{seed}-{i}" for i in range(n)))


def write_table(path: Path, X: np.ndarray, y: np.ndarray | None, ids: Sequence[str], *, label_column: str = "label",
                names: Sequence[str] | None = None) -> None:
    """A party's CSV as the CLIs read it: row_id, f0 .. f{d-1} (NaN: an empty cell), and, with `y`,
    the label column (-1: empty, unlabeled; `names`: class names instead of numbers)."""
    def label(c: int) -> object:
        return "" if c < 0 else (names[c] if names else int(c))

    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["row_id", *(f"f{j}" for j in range(X.shape[1])), *([label_column] if y is not None else [])])
        for i, row in enumerate(X):
            cells = ["" if np.isnan(v) else repr(float(v)) for v in row]
            w.writerow([ids[i], *cells, *([label(int(y[i]))] if y is not None else [])])


def chi2_vs_skellam(samples: np.ndarray, variance: float) -> float:
    """χ² p-value of integer samples against symmetric Skellam of `variance`: one bin per value out
    to where a bin expects 5 draws, everything beyond lumped into the two end bins. (Bins out to
    5σ expected 0.01 draws at 30 000 samples: one lawful draw there, which comes in about one run in
    a hundred, gave p = 10⁻¹¹ and failed the test.)"""
    from scipy import stats

    n = int(np.asarray(samples).size)
    wide = np.arange(0, int(20 * np.sqrt(variance)) + 20)
    dense = wide[stats.skellam.pmf(wide, variance / 2, variance / 2) * n >= 5]
    tail = int(dense.max()) if dense.size else 0
    ks = np.arange(-tail, tail + 1)
    probs = stats.skellam.pmf(ks, variance / 2, variance / 2)
    probs[[0, -1]] += (1 - probs.sum()) / 2
    observed = np.bincount(np.clip(samples, -tail, tail) + tail, minlength=ks.size)
    return float(stats.chisquare(observed, probs * n).pvalue)



def knn_graph(n: int, seed: int = 0, k: int = 10) -> sp.csr_matrix:
    """A kNN graph of clustered rows, as the coordinator builds it from Hamming distances (L = 256)."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((4, 8)) * 3
    X = centres[rng.integers(0, 4, n)] + rng.standard_normal((n, 8))
    H = hamming_matrix(lsh_codes(X, lsh_projection(seed, 256, 8)))
    return knn_adjacency(H, 256, GraphParams(k=k))
