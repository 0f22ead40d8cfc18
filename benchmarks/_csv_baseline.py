"""The CSV reader before pyarrow (xclp/data/tables.py at 590fa98), kept as the baseline of
benchmarks/tables_reader.py: Python's csv module, every cell held as a string, converted one by one."""

from __future__ import annotations

import csv
import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from xclp.data.validation import UNLABELED, check_features
from xclp.errors import InvalidInput


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


DELIMITERS = ",;\t|"


def load(path: str | os.PathLike[str], *, label_column: str | None = "label", id_column: str | None = None,
         delimiter: str | None = None) -> PartyData:
    """A party's table. CSV: UTF-8 (a byte-order mark, as Excel writes, is fine), a header row,
    `delimiter` one of , ; tab | (None: detected from the header). Row ids must be unique."""
    path = Path(path)
    if path.suffix == ".npz":
        return _load_npz(path)
    if delimiter is not None and (len(delimiter) != 1 or delimiter not in DELIMITERS):
        raise InvalidInput(f"--delimiter must be one of , ; tab | (one character), got {delimiter!r}")
    return _load_csv(path, label_column=label_column, id_column=id_column, delimiter=delimiter)


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
    _check_unique_ids(ids, [f"row {i}" for i in range(len(ids))], path)
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


def _sniff(header_line: str) -> str:
    """The delimiter of a header line: the candidate that splits it most (a comma if none does)."""
    counts = {d: header_line.count(d) for d in DELIMITERS}
    best = max(counts, key=lambda d: counts[d])
    return best if counts[best] else ","


def _check_unique_ids(ids: tuple[str, ...], where: list[str], path: Path) -> None:
    seen: dict[str, int] = {}
    for k, row_id in enumerate(ids):
        if row_id in seen:
            raise InvalidInput(f"{path}: row id {row_id!r} appears twice ({where[seen[row_id]]} and {where[k]}); "
                               "row ids must be unique, or predictions could not be told apart")
        seen[row_id] = k


def _label_cell(cell: str, path: Path, line: int) -> int:
    """A label cell: empty = unlabeled; an integer class, also written as an integral float ("1.0",
    as pandas writes an integer column that has empty cells)."""
    if cell == "":
        return UNLABELED
    try:
        return int(cell)
    except ValueError:
        pass
    try:
        value = float(cell)
    except ValueError:
        value = math.nan
    if math.isfinite(value) and value == int(value):
        return int(value)
    raise InvalidInput(f"{path} line {line}: label {cell!r} is not an integer class (leave it empty for unlabeled)")


def _load_csv(path: Path, *, label_column: str | None, id_column: str | None, delimiter: str | None) -> PartyData:
    try:
        with open(path, newline="", encoding="utf-8-sig") as fh:
            first = fh.readline()  # utf-8-sig: Excel's byte-order mark is not part of the first name
            fh.seek(0)
            sep = delimiter or _sniff(first)
            reader = csv.reader(fh, delimiter=sep)
            rows = [(reader.line_num, r) for r in reader]
    except OSError as exc:
        raise InvalidInput(f"cannot read {path}: {exc.strerror}") from None
    except (csv.Error, UnicodeDecodeError) as exc:
        raise InvalidInput(f"{path} is not a readable UTF-8 CSV file: {exc}") from None
    if not rows:
        raise InvalidInput(f"{path} is empty; it needs a header row naming the columns")
    header = [h.strip() for h in rows[0][1]]
    hint = ""
    sniffed = _sniff(first)
    if sniffed != sep and first.count(sniffed) > first.count(sep):
        flag = "tab" if sniffed == "\t" else repr(sniffed)
        hint = f" (the header looks {sniffed!r}-separated; pass --delimiter {flag})"
    elif len(header) == 1:
        hint = " (only one column was found: if the file is separated by something else, pass --delimiter)"
    dupes = sorted({h for h in header if header.count(h) > 1})
    if dupes:
        columns = {h: ", ".join(str(i + 1) for i, x in enumerate(header) if x == h) for h in dupes}
        where = ", ".join(f"{h!r} (columns {columns[h]})" for h in dupes)
        raise InvalidInput(f"{path}: the header names a column twice: {where}; every column needs its own name")
    body = [(line, r) for line, r in rows[1:] if any(cell.strip() for cell in r)]
    for line, r in body:
        if len(r) != len(header):
            raise InvalidInput(f"{path} line {line} has {len(r)} cells but the header has {len(header)}{hint}")
    if id_column is not None and id_column not in header:
        raise InvalidInput(f"{path} has no id column {id_column!r}; columns: {', '.join(header)}{hint}")
    has_label = label_column is not None and label_column in header
    feature_cols = [i for i, h in enumerate(header) if h not in {label_column, id_column}]
    if not feature_cols:
        raise InvalidInput(f"{path} has no feature columns{hint}")
    if not body:
        raise InvalidInput(f"{path} has a header but no rows")
    X = np.empty((len(body), len(feature_cols)), dtype=np.float64)
    for k, (line, r) in enumerate(body):
        for j, col in enumerate(feature_cols):
            try:
                X[k, j] = float(r[col])
            except ValueError:
                raise InvalidInput(f"{path} line {line}, column {header[col]!r}: {r[col]!r} is not a "
                                   f"number{hint}") from None
    X = check_features(X, name=f"features in {path}")
    y = None
    if has_label:
        li = header.index(label_column)  # type: ignore[arg-type]
        y = np.array([_label_cell(r[li].strip(), path, line) for line, r in body], dtype=np.int64)
        if np.any(y < UNLABELED):
            raise InvalidInput(f"{path}: labels must be class numbers >= 0 (empty = unlabeled)")
    if id_column:
        ids = tuple(r[header.index(id_column)] for _, r in body)
        _check_unique_ids(ids, [f"line {line}" for line, _ in body], path)
    else:
        ids = tuple(str(i) for i in range(len(body)))
    return PartyData(X, y, ids)
