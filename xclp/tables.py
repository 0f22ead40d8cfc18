"""A party's data: CSV (features, a label column with empty = unlabeled, optional id column) or
.npz (X, y, optional ids), validated with xclp.validation (DESIGN §8)."""

from __future__ import annotations

import csv
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from xclp.errors import InvalidInput
from xclp.validation import UNLABELED, check_features


@dataclass(frozen=True)
class PartyData:
    """X: float64[n, d]; y: int64[n] with -1 = unlabeled (or None: no label column); ids: str[n]."""

    X: np.ndarray
    y: np.ndarray | None
    ids: tuple[str, ...]

    def __post_init__(self) -> None:
        n = self.X.shape[0]
        if self.y is not None and self.y.shape != (n,):
            raise InvalidInput(f"{self.y.shape[0]} labels for {n} rows")
        if len(self.ids) != n:
            raise InvalidInput(f"{len(self.ids)} ids for {n} rows")

    @property
    def labeled(self) -> np.ndarray:
        """bool[n]: rows with a label."""
        if self.y is None:
            return np.zeros(self.X.shape[0], dtype=bool)
        return self.y != UNLABELED


def load(path: str | os.PathLike[str], *, label_column: str | None = "label", id_column: str | None = None) -> PartyData:
    path = Path(path)
    if path.suffix == ".npz":
        return _load_npz(path)
    return _load_csv(path, label_column=label_column, id_column=id_column)


def _load_npz(path: Path) -> PartyData:
    try:
        with np.load(path, allow_pickle=False) as npz:
            if "X" not in npz:
                raise InvalidInput(f"{path} needs an array named X (and y, optionally ids)")
            X = check_features(npz["X"], name=f"features in {path}")
            y = _labels(npz["y"], path) if "y" in npz else None
            ids = tuple(str(v) for v in npz["ids"]) if "ids" in npz else tuple(str(i) for i in range(X.shape[0]))
    except (OSError, ValueError) as exc:
        if isinstance(exc, InvalidInput):
            raise
        raise InvalidInput(f"cannot read {path}: {exc}") from None
    return PartyData(X, y, ids)


def _labels(raw: np.ndarray, path: Path) -> np.ndarray:
    arr = np.asarray(raw)
    if arr.ndim != 1:
        raise InvalidInput(f"labels in {path} must be 1-D")
    if arr.dtype.kind == "f":
        if not np.all(np.isfinite(arr) | np.isnan(arr)):
            raise InvalidInput(f"labels in {path} must be whole numbers")
        arr = np.where(np.isnan(arr), UNLABELED, arr)
        if not np.all(arr == np.round(arr)):
            raise InvalidInput(f"labels in {path} must be whole numbers (-1 or NaN = unlabeled)")
    elif arr.dtype.kind not in "iu":
        raise InvalidInput(f"labels in {path} must be integers, got {arr.dtype}")
    arr = arr.astype(np.int64)
    if np.any(arr < UNLABELED):
        raise InvalidInput(f"labels in {path} must be >= 0, or -1 for unlabeled")
    return arr


def _load_csv(path: Path, *, label_column: str | None, id_column: str | None) -> PartyData:
    try:
        with open(path, newline="") as fh:
            rows = list(csv.reader(fh))
    except OSError as exc:
        raise InvalidInput(f"cannot read {path}: {exc.strerror}") from None
    except (csv.Error, UnicodeDecodeError) as exc:
        raise InvalidInput(f"{path} is not a readable CSV file: {exc}") from None
    if not rows:
        raise InvalidInput(f"{path} is empty; it needs a header row naming the columns")
    header = [h.strip() for h in rows[0]]
    body = [r for r in rows[1:] if any(cell.strip() for cell in r)]
    for line, r in enumerate(body, start=2):
        if len(r) != len(header):
            raise InvalidInput(f"{path} line {line} has {len(r)} cells but the header has {len(header)}")
    if id_column is not None and id_column not in header:
        raise InvalidInput(f"{path} has no id column {id_column!r}; columns: {', '.join(header)}")
    has_label = label_column is not None and label_column in header
    feature_cols = [i for i, h in enumerate(header) if h not in {label_column, id_column}]
    if not feature_cols:
        raise InvalidInput(f"{path} has no feature columns")
    X = np.empty((len(body), len(feature_cols)), dtype=np.float64)
    for line, r in enumerate(body, start=2):
        for j, col in enumerate(feature_cols):
            try:
                X[line - 2, j] = float(r[col])
            except ValueError:
                raise InvalidInput(f"{path} line {line}, column {header[col]!r}: {r[col]!r} is not a number") from None
    X = check_features(X, name=f"features in {path}")
    y = None
    if has_label:
        li = header.index(label_column)  # type: ignore[arg-type]
        y = np.empty(len(body), dtype=np.int64)
        for line, r in enumerate(body, start=2):
            cell = r[li].strip()
            try:
                y[line - 2] = UNLABELED if cell == "" else int(cell)
            except ValueError:
                raise InvalidInput(
                    f"{path} line {line}: label {cell!r} is not an integer class (leave it empty for unlabeled)"
                ) from None
        if np.any(y < UNLABELED):
            raise InvalidInput(f"{path}: labels must be class numbers >= 0 (empty = unlabeled)")
    ids = tuple(r[header.index(id_column)] for r in body) if id_column else tuple(str(i) for i in range(len(body)))
    return PartyData(X, y, ids)
