"""A party's table once read (docs/design.md §9): its features, labels as written, row ids, and where each
row came from, for messages. Reading is xclp.data.tables; the job's own preparation is xclp.data.prep.

- X is float64[n, d] with NaN for a missing cell (filled by `impute = "mean"`, else refused).
- Labels are kept as written (`Labels`: a code per row into the distinct cell values), because a
  label means a class number or a declared class name only once the job is known
  (`PartyData.with_classes`). Empty label cells are unlabeled rows.
"""

from __future__ import annotations

import csv
import hashlib
import json
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from xclp.data.validation import UNLABELED
from xclp.errors import InvalidInput

# Cells read as missing (NaN) in feature columns and as empty (unlabeled) in the label column:
# what pandas, R, Excel and SQL exports write for "no value".
NULL_CELLS = ("", "NA", "N/A", "n/a", "NaN", "nan", "null", "NULL", "#N/A", "None")


@dataclass(frozen=True)
class Labels:
    """The label column as written: `codes` int32[n] index `values`, −1 marks an empty cell."""

    codes: np.ndarray
    values: tuple[str, ...]

    @property
    def labeled(self) -> np.ndarray:
        return self.codes >= 0

    @property
    def are_numbers(self) -> bool:
        """Whether every cell reads as a class number (so the labels are known before the job)."""
        return all(_class_number(v) is not None for v in self.values)

    def numbers(self, where: Locator) -> np.ndarray:
        """int64[n]: the cells as class numbers ("1", or "1.0" as pandas writes an integer column
        with gaps); −1 for empty cells."""
        table = np.empty(len(self.values) + 1, dtype=np.int64)
        table[-1] = UNLABELED
        for k, cell in enumerate(self.values):
            number = _class_number(cell)
            if number is None or number < 0:
                row = int(np.flatnonzero(self.codes == k)[0])
                hint = ("; declare the class names in the job file (classes = [...])"
                        if number is None and not _numeric(cell) else " (leave it empty for unlabeled)")
                raise InvalidInput(f"{where.at(row)}: label {cell!r} is not an integer class >= 0{hint}")
            table[k] = number
        return table[self.codes]

    def named(self, classes: Sequence[str], where: Locator) -> np.ndarray:
        """int64[n]: each cell's position in the declared `classes`; −1 for empty cells."""
        index = {name: i for i, name in enumerate(classes)}
        table = np.empty(len(self.values) + 1, dtype=np.int64)
        table[-1] = UNLABELED
        for k, cell in enumerate(self.values):
            if cell not in index:
                row = int(np.flatnonzero(self.codes == k)[0])
                raise InvalidInput(f"{where.at(row)}: label {cell!r} is not one of the job's classes: "
                                   f"{', '.join(repr(c) for c in classes)}")
            table[k] = index[cell]
        return table[self.codes]


def _class_number(cell: str) -> int | None:
    try:
        return int(cell)
    except ValueError:
        pass
    try:
        value = float(cell)
    except ValueError:
        return None
    return int(value) if math.isfinite(value) and value == int(value) else None


def _numeric(cell: str) -> bool:
    try:
        float(cell)
    except ValueError:
        return False
    return True


@dataclass(frozen=True)
class Locator:
    """Names row k of a source in messages: "data.csv line 12", "data.parquet row 3"."""

    path: str = ""
    kind: str = "row"  # "line" for CSV (found by a rescan, only when an error needs it)
    delimiter: str = ","
    base: int = 0  # what row 0 is called

    def at(self, row: int) -> str:
        prefix = f"{self.path} " if self.path else ""
        if self.kind == "line":
            return f"{prefix}line {_csv_line_of(Path(self.path), self.delimiter, row)}"
        return f"{prefix}row {row + self.base}"


@dataclass(frozen=True)
class PartyData:
    """X: float64[n, d], NaN = a missing cell; y: int64[n] with −1 = unlabeled (None: no class
    numbers yet, see `labels`); ids: str[n]; columns: the feature names (empty when unnamed).

    `id_column` is not part of the data set's name (xclp.data.identity takes the ids by their role)."""

    X: np.ndarray
    y: np.ndarray | None
    ids: tuple[str, ...]
    columns: tuple[str, ...] = ()
    labels: Labels | None = None
    where: Locator = field(default_factory=Locator)
    # the data set this table is in a party's ledger when not the table itself (a table with some
    # labels held out by `xclp-client run --validate` is still the whole table's data set)
    dataset_digest: bytes | None = None
    # the name of the column the ids were read from (None: row numbers, or a table without names);
    # outputs name their id column after it, so that they join back onto the user's table
    id_column: str | None = None

    def __post_init__(self) -> None:
        n = self.X.shape[0]
        if self.y is not None and self.y.shape != (n,):
            raise InvalidInput(f"{self.y.shape[0]} labels for {n} rows")
        if self.labels is not None and self.labels.codes.shape != (n,):
            raise InvalidInput(f"{self.labels.codes.shape[0]} labels for {n} rows")
        if len(self.ids) != n:
            raise InvalidInput(f"{len(self.ids)} ids for {n} rows")
        if self.columns and len(self.columns) != self.X.shape[1]:
            raise InvalidInput(f"{len(self.columns)} column names for {self.X.shape[1]} features")

    @property
    def labeled(self) -> np.ndarray:
        """bool[n]: rows with a label."""
        if self.y is not None:
            return self.y != UNLABELED
        if self.labels is not None:
            return self.labels.labeled
        return np.zeros(self.X.shape[0], dtype=bool)

    @property
    def missing(self) -> np.ndarray:
        """int64[d]: missing cells per feature column."""
        return np.isnan(self.X).sum(axis=0)

    def with_classes(self, classes: Sequence[str] | None) -> PartyData:
        """The labels as class numbers: by position in the job's declared `classes`, else as written.
        (Labels given as numbers in an array, y without `labels`, are class numbers already.)"""
        if self.labels is None:
            return self
        y = self.labels.named(classes, self.where) if classes else self.labels.numbers(self.where)
        return replace(self, y=y)

    def check_missing(self, *, impute: bool, hint: str = "") -> np.ndarray:
        """int64[d] missing cells per feature; InvalidInput naming the first unless the job imputes."""
        missing = self.missing
        if missing.any() and not impute:
            j = int(np.flatnonzero(missing)[0])
            row = int(np.flatnonzero(np.isnan(self.X[:, j]))[0])
            name = repr(self.columns[j]) if self.columns else f"{j + 1}"
            raise InvalidInput(f"{self.where.at(row)}, column {name}: the cell is empty or NaN ({int(missing.sum())} "
                               "such feature cells in all); " + (hint or "the job fills them with the pooled mean if "
                                                                         "its "
                               'file sets impute = "mean" (ask the operator), or fill or drop them yourself'))
        return missing

    @property
    def schema_digest(self) -> bytes:
        """SHA-256 of the feature column names in order (empty when unnamed): parties whose
        columns differ are refused at Join without anyone seeing the names."""
        return schema_digest(self.columns) if self.columns else b""


def schema_digest(columns: Sequence[str]) -> bytes:
    """SHA-256 of feature column names in order (a party's DataSummary.schema; a job's `columns`)."""
    return hashlib.sha256(json.dumps(list(columns)).encode()).digest()


def csv_records(path: Path, sep: str) -> Iterator[tuple[int, list[str]]]:
    """(line number, cells) of every data record with a cell that is not empty (as the pyarrow read
    skips the others), as Python's csv reads them."""
    with open(path, newline="", encoding="utf-8-sig") as fh:
        reader = csv.reader(fh, delimiter=sep)
        next(reader, None)
        for cells in reader:
            if any(cell.strip() not in NULL_CELLS for cell in cells):
                yield reader.line_num, cells


def _csv_line_of(path: Path, sep: str, row: int) -> int:
    for k, (line, _) in enumerate(csv_records(path, sep)):
        if k == row:
            return line
    return -1
