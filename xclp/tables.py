"""Reading a party's table: CSV, Parquet or .npz into an xclp.party_table.PartyData (DESIGN §9).

- CSV and Parquet go through pyarrow's streaming readers (multi-threaded CSV parsing, typed
  columns): batches are written straight into one preallocated float64 matrix, so memory stays
  near the size of that matrix. A cell pyarrow cannot read sends the file through a line-by-line
  diagnosis that names the line, column and value (slow, but only on the way to an error).
- Feature cells that are empty (or NA, NaN, null) are *missing* and read as NaN: a job with
  `impute = "mean"` fills them with the pooled mean, any other job refuses them (xclp.prep).
- Columns the job declares categorical become one 0/1 column per declared category.
- Row ids must be unique; feature column names must be unique.
"""

from __future__ import annotations

import csv
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from xclp.errors import InvalidInput
from xclp.party_table import NULL_CELLS, Labels, Locator, PartyData, csv_records
from xclp.validation import UNLABELED, check_features

__all__ = ["DEFAULT_LABEL", "DELIMITERS", "DefaultLabel", "Labels", "PartyData", "TextFeature", "from_arrow", "load",
           "read_any"]

DELIMITERS = ",;\t|"


class DefaultLabel(str):
    """The label column's name when the user named none: a table without that column has no
    labels (every row unlabeled), where a name the user gave must be one of the table's columns."""


DEFAULT_LABEL = DefaultLabel("label")


class TextFeature(InvalidInput):
    """A feature column holds text: refused unless the job declares it categorical (whose
    parameters a party learns only after connecting)."""


BLOCK_BYTES = 4 << 20  # bytes of CSV per parsed batch (pyarrow reads a few ahead)


def load(path: str | os.PathLike[str], *, label_column: str | None = DEFAULT_LABEL, id_column: str | None = None,
         delimiter: str | None = None, categorical: Mapping[str, Sequence[str]] | None = None) -> PartyData:
    """A party's table: .csv (UTF-8, a header row, `delimiter` one of , ; tab | — a tab also spelled
    "tab" or "\\t", as typed in a flag or a TOML file — or None to detect it from the header),
    .parquet, or .npz (X, optional y, ids, columns).

    `categorical` (CSV and Parquet): column name -> its categories; each such column becomes one
    0/1 column per category, in the declared order, named "column=category" (an empty cell: NaN
    in all of them; a category not declared: refused)."""
    path = Path(path)
    if delimiter in ("tab", "\\t"):
        delimiter = "\t"
    if delimiter is not None and (len(delimiter) != 1 or delimiter not in DELIMITERS):
        raise InvalidInput(f"--delimiter must be one of , ; tab | (one character), got {delimiter!r}")
    if not path.exists():
        raise InvalidInput(f"cannot read {path}: no such file")
    if path.is_dir():
        raise InvalidInput(f"cannot read {path}: it is a directory")
    categorical = dict(categorical or {})
    if path.suffix == ".npz":
        if categorical:
            raise InvalidInput(f"{path}: the job declares categorical columns ({', '.join(categorical)}), which a .npz "
                               "matrix cannot hold; give the table as CSV or Parquet")
        return _load_npz(path)
    if path.suffix in (".parquet", ".pq"):
        return _load_parquet(path, label_column=label_column, id_column=id_column, categorical=categorical)
    return _load_csv(path, label_column=label_column, id_column=id_column, delimiter=delimiter, categorical=categorical)


def read_any(data: Any, *, label_column: str | None = DEFAULT_LABEL, id_column: str | None = None,
             delimiter: str | None = None, categorical: Mapping[str, Sequence[str]] | None = None) -> PartyData:
    """A party's table from a path (`load`), a pandas DataFrame (its index dropped) or a pyarrow
    Table (`from_arrow`), arrays (X, y) or (X, y, ids) with y's −1 meaning unlabeled, or a PartyData."""
    if isinstance(data, PartyData):
        return data
    if isinstance(data, (str, os.PathLike)):
        return load(data, label_column=label_column, id_column=id_column, delimiter=delimiter,
                    categorical=categorical)
    if isinstance(data, tuple):
        return _arrays(data, categorical)
    arrow = _as_arrow(data)
    if arrow is None:
        raise InvalidInput(f"data must be a path, a pandas DataFrame, a pyarrow Table or arrays (X, y[, ids]); got "
                           f"{type(data).__name__}")
    return from_arrow(arrow, label_column=label_column, id_column=id_column, categorical=categorical,
                      name=f"the {type(data).__name__}")


def _as_arrow(data: Any) -> Any:
    """A pyarrow Table of a pyarrow Table or a pandas DataFrame (its index dropped), else None."""
    import pyarrow as pa

    if isinstance(data, pa.Table):
        return data
    if type(data).__name__ == "DataFrame" and type(data).__module__.startswith("pandas"):
        if not all(isinstance(c, str) for c in data.columns):
            raise InvalidInput("the DataFrame's column names must be strings, got "
                               f"{', '.join(repr(c) for c in data.columns if not isinstance(c, str))[:200]}")
        try:
            return pa.Table.from_pandas(data, preserve_index=False)
        except (pa.ArrowException, TypeError, ValueError) as exc:
            raise InvalidInput(f"the DataFrame cannot be read: {exc}") from None
    return None


def _arrays(data: tuple[Any, ...], categorical: Mapping[str, Sequence[str]] | None) -> PartyData:
    if categorical:
        raise InvalidInput(f"the job declares categorical columns ({', '.join(categorical)}), which arrays cannot "
                           "hold; give the table as a DataFrame or a file")
    if len(data) not in (2, 3):
        raise InvalidInput(f"arrays are (X, y) or (X, y, ids), got a tuple of {len(data)}")
    X = feature_matrix(data[0], "X")
    try:
        y = None if data[1] is None else np.asarray(data[1])
    except (TypeError, ValueError) as exc:
        raise InvalidInput(f"y cannot be read as an array: {exc}") from None
    if y is not None and (y.ndim != 1 or y.dtype.kind not in "iu"):
        if y.ndim == 1 and y.dtype.kind == "f" and np.all(np.isfinite(y)) and np.all(y == np.round(y)):
            y = y.astype(np.int64)
        else:
            raise InvalidInput(f"y must be one integer class number per row (−1 = unlabeled); got {y.dtype} of "
                               f"shape {y.shape}")
    if y is not None and y.size and y.min() < -1:
        raise InvalidInput(f"y holds {int(y.min())}: class numbers are 0, 1, ...; −1 marks an unlabeled row")
    ids = tuple(str(i) for i in data[2]) if len(data) == 3 else tuple(str(i) for i in range(X.shape[0]))
    table = PartyData(X, None if y is None else y.astype(np.int64), ids)
    check_unique_ids(ids)
    return table


# --- npz ----------------------------------------------------------------------------------------


def _load_npz(path: Path) -> PartyData:
    where = Locator(str(path))
    try:
        with np.load(path, allow_pickle=False) as npz:
            if "X" not in npz:
                raise InvalidInput(f"{path} needs an array named X (and y, optionally ids and columns)")
            X = feature_matrix(npz["X"], f"features in {path}")
            y, labels = _npz_labels(npz["y"], path) if "y" in npz else (None, None)
            ids = tuple(str(v) for v in npz["ids"]) if "ids" in npz else tuple(str(i) for i in range(X.shape[0]))
            columns = tuple(str(c) for c in npz["columns"]) if "columns" in npz else ()
    except (OSError, ValueError) as exc:
        if isinstance(exc, InvalidInput):
            raise
        raise InvalidInput(f"cannot read {path}: {exc}") from None
    _check_columns(columns, path)
    check_unique_ids(ids, where)
    return PartyData(X, y, ids, columns, labels, where)


def _npz_labels(raw: np.ndarray, path: Path) -> tuple[np.ndarray | None, Labels | None]:
    """(class numbers, None) for a numeric y; (None, names) for a string y ('' = unlabeled)."""
    arr = np.asarray(raw)
    if arr.ndim != 1:
        raise InvalidInput(f"labels in {path} must be 1-D")
    if arr.dtype.kind == "U":
        return None, _encode_labels(np.char.strip(arr))
    if arr.dtype.kind == "f":
        if not np.all(np.isfinite(arr) | np.isnan(arr)):
            raise InvalidInput(f"labels in {path} must be whole numbers")
        arr = np.where(np.isnan(arr), UNLABELED, arr)
        if not np.all(arr == np.round(arr)):
            raise InvalidInput(f"labels in {path} must be whole numbers (-1 or NaN = unlabeled)")
    elif arr.dtype.kind not in "iu":
        raise InvalidInput(f"labels in {path} must be integers or class names, got {arr.dtype}")
    arr = arr.astype(np.int64)
    if np.any(arr < UNLABELED):
        raise InvalidInput(f"labels in {path} must be >= 0, or -1 for unlabeled")
    return arr, None


def _encode_labels(cells: np.ndarray) -> Labels:
    """Labels of a str[n] array of cells ('' = empty)."""
    values, codes = np.unique(cells, return_inverse=True)
    values = values.tolist()
    codes = codes.astype(np.int32)
    if values and values[0] == "":
        codes -= 1
        values = values[1:]
    return Labels(codes, tuple(values))


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


def _sniff(header_line: str) -> str:
    """The delimiter of a header line: the candidate that splits it most (a comma if none does)."""
    counts = {d: header_line.count(d) for d in DELIMITERS}
    best = max(counts, key=lambda d: counts[d])
    return best if counts[best] else ","


def _read_header(path: Path, delimiter: str | None) -> tuple[list[str], str, str]:
    """(column names, delimiter, a hint for messages when the delimiter looks wrong)."""
    try:
        with open(path, newline="", encoding="utf-8-sig") as fh:
            first = fh.readline()  # utf-8-sig: Excel's byte-order mark is not part of the first name
            fh.seek(0)
            sep = delimiter or _sniff(first)
            header = next(csv.reader(fh, delimiter=sep), None)
    except OSError as exc:
        raise InvalidInput(f"cannot read {path}: {exc.strerror}") from None
    except (csv.Error, UnicodeDecodeError) as exc:
        raise InvalidInput(f"{path} is not a readable UTF-8 CSV file: {exc}") from None
    if not header or not any(h.strip() for h in header):
        raise InvalidInput(f"{path} is empty; it needs a header row naming the columns")
    hint = ""
    sniffed = _sniff(first)
    if sniffed != sep and first.count(sniffed) > first.count(sep):
        flag = "tab" if sniffed == "\t" else repr(sniffed)
        hint = f" (the header looks {sniffed!r}-separated; pass --delimiter {flag})"
    elif len(header) == 1:
        hint = " (only one column was found: if the file is separated by something else, pass --delimiter)"
    return [h.strip() for h in header], sep, hint


def _check_columns(header: Sequence[str], path: str | Path) -> None:
    dupes = sorted({h for h in header if header.count(h) > 1})
    if dupes:
        columns = {h: ", ".join(str(i + 1) for i, x in enumerate(header) if x == h) for h in dupes}
        where = ", ".join(f"{h!r} (columns {columns[h]})" for h in dupes)
        raise InvalidInput(f"{path}: the header names a column twice: {where}; every column needs its own name")


def _roles(header: list[str], path: str | Path, label_column: str | None, id_column: str | None,
           hint: str, categorical: Mapping[str, Sequence[str]] = {}) -> tuple[list[int], int | None, int | None]:
    """(feature column indices, label column index, id column index)."""
    _check_columns(header, path)
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


def _load_csv(path: Path, *, label_column: str | None, id_column: str | None, delimiter: str | None,
              categorical: Mapping[str, Sequence[str]]) -> PartyData:
    import pyarrow as pa
    import pyarrow.csv as pacsv

    header, sep, hint = _read_header(path, delimiter)
    try:
        features, label, ident = _roles(header, path, label_column, id_column, hint, categorical)
    except InvalidInput:
        if hint:  # a wrong delimiter: the rows say so more plainly than the header
            _diagnose_csv(path, sep, header, [], None, hint)
        raise
    names = [f"c{i}" for i in range(len(header))]  # pyarrow's names: free of duplicates and odd characters
    types = {names[i]: pa.string() if header[i] in categorical else pa.float64() for i in features}
    types.update({names[i]: pa.string() for i in (label, ident) if i is not None})
    try:
        reader = pacsv.open_csv(
            path,
            read_options=pacsv.ReadOptions(column_names=names, skip_rows=1, block_size=BLOCK_BYTES, use_threads=True),
            parse_options=pacsv.ParseOptions(delimiter=sep, newlines_in_values=True),
            convert_options=pacsv.ConvertOptions(column_types=types, null_values=list(NULL_CELLS),
                                                 strings_can_be_null=True, quoted_strings_can_be_null=True))
        where = Locator(str(path), "line", sep)
        table = _Collector(_row_bound(path), [(names[i], header[i], categorical.get(header[i])) for i in features],
                           names[label] if label is not None else None, names[ident] if ident is not None else None,
                           where)
        for batch in reader:
            table.add(batch)
    except OSError as exc:
        raise InvalidInput(f"cannot read {path}: {exc.strerror or exc}") from None
    except (pa.ArrowInvalid, pa.ArrowException, UnicodeDecodeError) as exc:
        _diagnose_csv(path, sep, header, [i for i in features if header[i] not in categorical], label, hint)
        raise InvalidInput(f"{path} cannot be read as CSV: {exc}{hint}") from None
    return table.finish(path, f"features in {path}")


def _row_bound(path: Path) -> int:
    """An upper bound on the data rows of a CSV file: its line count (newlines inside quoted cells
    and blank lines only make it larger). The matrix is allocated to this bound untouched, so
    only the pages of real rows are ever used."""
    lines = 0
    last = b"\n"
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 24):
            lines += chunk.count(b"\n")
            last = chunk[-1:]
    return lines + (last != b"\n")


Feature = tuple[str, str, "Sequence[str] | None"]  # (arrow column, column name, categories or None)


class _Collector:
    """Writes record batches into one float64 matrix (a categorical column as one 0/1 column per
    category), the labels as codes and the ids as strings."""

    def __init__(self, bound: int, features: list[Feature], label: str | None, ident: str | None,
                 where: Locator) -> None:
        self.features, self.label, self.ident, self.where = features, label, ident, where
        self.columns = [col for _, name, cats in features
                        for col in ([f"{name}={c}" for c in cats] if cats else [name])]
        self.X = np.empty((max(bound, 1), len(self.columns)), dtype=np.float64)
        self.n = 0
        self.codes: list[np.ndarray] = []
        self.values: dict[str, int] = {}
        self.ids: list[str] = []
        self.blank: list[np.ndarray] = []  # bool per batch: rows with every cell empty

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
        return PartyData(X, y, ids, tuple(self.columns), labels, self.where)


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


def _diagnose_csv(path: Path, sep: str, header: list[str], features: list[int], label: int | None, hint: str) -> None:
    """Find the first cell pyarrow could not read and raise an InvalidInput naming it."""
    try:
        for line, cells in csv_records(path, sep):
            if len(cells) != len(header):
                raise InvalidInput(f"{path} line {line} has {len(cells)} cells but the header has {len(header)}{hint}")
            for j in features:
                cell = cells[j].strip()
                if cell in NULL_CELLS:
                    continue
                try:
                    float(cell)
                except ValueError:
                    raise TextFeature(f"{path} line {line}, column {header[j]!r}: {cells[j]!r} is not a "
                                       f"number{hint}") from None
    except (csv.Error, UnicodeDecodeError) as exc:
        raise InvalidInput(f"{path} is not a readable UTF-8 CSV file: {exc}") from None


# --- Parquet ------------------------------------------------------------------------------------


def _load_parquet(path: Path, *, label_column: str | None, id_column: str | None,
                  categorical: Mapping[str, Sequence[str]]) -> PartyData:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
    except (OSError, pa.ArrowException) as exc:
        raise InvalidInput(f"cannot read {path} as Parquet: {exc}") from None
    return _arrow(pf.schema_arrow, pf.metadata.num_rows, lambda columns: pf.iter_batches(65536, columns=columns),
                  str(path), Locator(str(path), "row", base=1), label_column=label_column, id_column=id_column,
                  categorical=categorical)


def from_arrow(table: Any, *, label_column: str | None = DEFAULT_LABEL, id_column: str | None = None,
               categorical: Mapping[str, Sequence[str]] | None = None, name: str = "the data") -> PartyData:
    """A party's table from a pyarrow.Table, with the same rules as a Parquet file: every column but
    the label and id columns is a numeric feature (or declared categorical); a null feature cell is
    missing, a null label unlabeled. `name` says where the table came from in error messages."""
    import pyarrow as pa

    if not isinstance(table, pa.Table):
        raise InvalidInput(f"{name}: expected a pyarrow.Table, got {type(table).__name__}")
    return _arrow(table.schema, table.num_rows, lambda columns: table.select(columns).to_batches(65536), name,
                  Locator("", "row"), label_column=label_column, id_column=id_column,
                  categorical=dict(categorical or {}))


def _arrow(schema: Any, rows: int, batches: Callable[[list[str]], Iterable[Any]], name: str, where: Locator, *,
           label_column: str | None, id_column: str | None, categorical: Mapping[str, Sequence[str]]) -> PartyData:
    """Arrow record batches (of a Parquet file or an in-memory table) into PartyData."""
    import pyarrow as pa

    header = [str(n) for n in schema.names]
    features, label, ident = _roles(header, name, label_column, id_column, "", categorical)
    for j in features:
        if header[j] in categorical:
            continue
        kind = schema.field(j).type
        if not (pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_decimal(kind)
                or pa.types.is_boolean(kind) or pa.types.is_null(kind)):
            raise TextFeature(f"{name}: column {header[j]!r} holds {kind}, not numbers; every column other than "
                               "the label and id columns is a feature and must be numeric")
    names = [header[j] for j in features]
    numeric = [n for n in names if n not in categorical]
    table = _Collector(rows, [(n, n, categorical.get(n)) for n in names],
                       header[label] if label is not None else None, header[ident] if ident is not None else None,
                       where)
    wanted = names + [header[i] for i in (label, ident) if i is not None]
    try:
        for batch in batches(wanted):
            columns = [batch.column(n).cast(pa.float64()) if n in numeric else batch.column(n).cast(pa.string())
                       for n in batch.schema.names]
            table.add(pa.RecordBatch.from_arrays(columns, names=batch.schema.names))
    except (OSError, pa.ArrowException) as exc:
        raise InvalidInput(f"cannot read {name}: {exc}") from None
    return table.finish(name, f"features in {name}")


# --- ids ----------------------------------------------------------------------------------------


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
