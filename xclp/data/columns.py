"""What every reader of a party's table shares (xclp.data.tables): which column is which
(`roles`), a table's columns collected batch by batch into one float64 matrix, labels and row ids
(`Collector`), and the checks of a feature column (`feature_matrix`, `TextFeature`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from xclp.data.identity import LABEL, table_digest
from xclp.data.party_table import Labels, Locator, PartyData
from xclp.data.validation import check_features
from xclp.errors import InvalidInput


class DefaultLabel(str):
    """The label column's name when the user named none: a table without that column has no
    labels (every row unlabeled), where a name the user gave must be one of the table's columns."""


DEFAULT_LABEL = DefaultLabel("label")


Feature = tuple[str, str, "Sequence[str] | None"]  # (arrow column, column name, categories or None)


class TextFeature(InvalidInput):
    """A feature column holds text: refused unless the job declares it categorical (whose
    parameters a party learns only after connecting)."""


def feature_matrix(raw: object, name: str) -> np.ndarray:
    """float64[n, d]; NaN is a missing cell, ±inf is refused. No copy of a float64 matrix."""
    try:
        X = np.asarray(raw, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise InvalidInput(f"{name} must be numeric: {exc}") from None
    if X.ndim != 2 or X.size == 0:
        return check_features(X, name=name)  # its message for the wrong shape or an empty table
    inf = np.isinf(X)
    if inf.any():
        row, col = (int(v) for v in np.argwhere(inf)[0])
        raise InvalidInput(f"{name} contain {int(inf.sum())} NaN/inf values that are not empty cells (first at row "
                           f"{row}, column {col}); fix or empty them")
    return X


# --- CSV ----------------------------------------------------------------------------------------


def check_columns(header: Sequence[str], path: str | Path) -> None:
    dupes = sorted({h for h in header if header.count(h) > 1})
    if dupes:
        columns = {h: ", ".join(str(i + 1) for i, x in enumerate(header) if x == h) for h in dupes}
        where = ", ".join(f"{h!r} (columns {columns[h]})" for h in dupes)
        raise InvalidInput(f"{path}: the header names a column twice: {where}; every column needs its own name")


def roles(header: list[str], path: str | Path, label_column: str | None, id_column: str | None,
           hint: str, categorical: Mapping[str, Sequence[str]] = {}) -> tuple[list[int], int | None, int | None]:
    """(feature column indices, label column index, id column index)."""
    check_columns(header, path)
    absent = [c for c in categorical if c not in header]
    if absent:
        raise InvalidInput(f"{path} has no column {', '.join(repr(c) for c in absent)}, which the job declares "
                           f"categorical; columns: {', '.join(header)}{hint}")
    if id_column is not None and id_column not in header:
        raise InvalidInput(f"{path} has no id column {id_column!r}; columns: {', '.join(header)}{hint}")
    if label_column is not None and label_column not in header and not isinstance(label_column, DefaultLabel):
        raise InvalidInput(f"{path} has no label column {label_column!r}; columns: {', '.join(header)}{hint}")
    label = header.index(label_column) if label_column is not None and label_column in header else None
    ident = header.index(id_column) if id_column is not None else None
    features = [i for i in range(len(header)) if i not in (label, ident)]
    if not features:
        raise InvalidInput(f"{path} has no feature columns{hint}")
    return features, label, ident


class Collector:
    """Writes record batches into one float64 matrix (a categorical column as one 0/1 column per
    category), the labels as codes and the ids as strings."""

    def __init__(self, bound: int, features: list[Feature], label: str | None, ident: str | None,
                 where: Locator, *, id_name: str | None = None) -> None:
        self.features, self.label, self.ident, self.where = features, label, ident, where
        self.id_name = id_name  # the id column's name in the file (ident may be pyarrow's name for it)
        self.columns = [col for _, name, cats in features
                        for col in ([f"{name}={c}" for c in cats] if cats else [name])]
        self.X = np.empty((max(bound, 1), len(self.columns)), dtype=np.float64)
        self.n = 0
        self.codes: list[np.ndarray] = []
        self.values: dict[str, int] = {}
        self.ids: list[str] = []
        self.blank: list[np.ndarray] = []  # bool per batch: rows with every cell empty
        self.levels: dict[str, list[np.ndarray]] = {}  # a categorical column: its category per row (−1 empty)

    def add(self, batch: Any) -> None:  # a pyarrow.RecordBatch (pyarrow has no type information)
        import pyarrow.compute as pc

        b = batch.num_rows
        if self.n + b > self.X.shape[0]:
            self.X = np.concatenate([self.X[: self.n], np.empty((self.n + b - self.X.shape[0], self.X.shape[1]))])
        empty = np.ones(b, dtype=bool)
        rows = slice(self.n, self.n + b)
        j = 0
        unknown: tuple[int, str, str, Sequence[str]] | None = None
        for arrow_name, name, categories in self.features:
            column = batch.column(arrow_name)
            if categories is None:
                self.X[rows, j] = column.to_numpy(zero_copy_only=False)
                j += 1
            else:
                idx, values = _encode(pc, column)
                index = {c: k for k, c in enumerate(categories)}
                local = np.array([index.get(v, -2) for v in values] + [-1], dtype=np.int64)
                level = local[idx]
                if (level == -2).any() and unknown is None:
                    i = int(np.flatnonzero(level == -2)[0])
                    unknown = (i, name, values[idx[i]], categories)
                onehot = (level[:, None] == np.arange(len(categories))).astype(np.float64)
                onehot[level == -1] = np.nan
                self.X[rows, j: j + len(categories)] = onehot
                self.levels.setdefault(name, []).append(level)
                j += len(categories)
            empty &= column.is_null().to_numpy(zero_copy_only=False)
        if self.label is not None:
            idx, values = _encode(pc, batch.column(self.label))
            local = np.array([self.values.setdefault(v, len(self.values)) for v in values] + [-1], dtype=np.int32)
            self.codes.append(local[idx])
            empty &= idx < 0
        if self.ident is not None:
            column = batch.column(self.ident)
            self.ids.extend("" if v is None else v for v in column.to_pylist())
            empty &= column.is_null().to_numpy(zero_copy_only=False)
        if unknown is not None:
            i, name, value, categories = unknown
            row = self.n - sum(int(e.sum()) for e in self.blank) + i - int(empty[:i].sum())
            raise InvalidInput(f"{self.where.at(row)}, column {name!r}: {value!r} is not one of the job's categories "
                               f"for it: {', '.join(repr(c) for c in categories)}")
        self.blank.append(empty)
        self.n += b

    def finish(self, path: str | Path, name: str) -> PartyData:
        X = self.X[: self.n]
        keep = ~np.concatenate(self.blank) if self.blank else np.zeros(0, dtype=bool)
        if not keep.all():  # rows whose every cell is empty are not data (spreadsheets leave them)
            X = X[keep]
        if X.shape[0] == 0:
            raise InvalidInput(f"{path} has a header but no rows")
        X = feature_matrix(X, name)
        labels = None
        if self.label is not None:
            codes = np.concatenate(self.codes)[keep]
            labels = _sorted_labels(codes, self.values)
        if self.ident is not None:
            ids = tuple(i for i, k in zip(self.ids, keep) if k)
        else:
            ids = tuple(str(i) for i in range(X.shape[0]))
        check_unique_ids(ids, self.where)
        y = labels.numbers(self.where) if labels is not None and labels.are_numbers else None
        table = PartyData(X, y, ids, tuple(self.columns), labels, self.where, id_column=self.id_name)
        if not self.levels:  # the matrix holds the cells as read: xclp.data.identity names it when asked
            return table
        return replace(table, dataset_digest=self._digest(table, keep))

    def _digest(self, table: PartyData, keep: np.ndarray) -> bytes:
        """The table's name in the ledger (xclp.data.identity): a categorical column by its cells as
        written, not by the job's one-hot encoding of them."""
        columns: dict[str, Any] = {}
        j = 0
        for _, name, categories in self.features:
            if categories is None:
                columns[name] = table.X[:, j]
                j += 1
            else:
                level = np.concatenate(self.levels[name])[keep] if self.levels.get(name) else np.zeros(0, np.int64)
                columns[name] = list(np.array([*categories, None], dtype=object)[level])
                j += len(categories)
        if table.labels is not None:
            columns[LABEL] = list(np.array([*table.labels.values, None], dtype=object)[table.labels.codes])
        return table_digest(columns, table.ids)


def _encode(pc: Any, column: Any) -> tuple[np.ndarray, list[str]]:  # pyarrow.compute, a pyarrow array
    """(int64[b] index into the values, −1 for an empty cell; the distinct values, trimmed)."""
    column = pc.utf8_trim_whitespace(column)
    column = pc.if_else(pc.equal(column, ""), None, column)
    encoded = column.dictionary_encode()
    return encoded.indices.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64), encoded.dictionary.to_pylist()


def _sorted_labels(codes: np.ndarray, values: dict[str, int]) -> Labels:
    """Labels with values in sorted order (so the same cells give the same codes in any file)."""
    order = sorted(values, key=str)
    remap = np.empty(len(values) + 1, dtype=np.int32)
    remap[-1] = -1
    for new, value in enumerate(order):
        remap[values[value]] = new
    return Labels(remap[codes], tuple(order))


def check_unique_ids(ids: tuple[str, ...], where: Locator = Locator()) -> None:
    seen: dict[str, int] = {}
    for k, row_id in enumerate(ids):
        if row_id in seen:
            first, second = where.at(seen[row_id]), where.at(k)
            if where.path:
                first, second = first.removeprefix(where.path + " "), second.removeprefix(where.path + " ")
            raise InvalidInput(f"{where.path or 'the data'}: row id {row_id!r} appears twice ({first} and {second}); "
                               "row ids must be unique, or predictions could not be told apart")
        seen[row_id] = k
