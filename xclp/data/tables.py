"""Reading a party's table: CSV, Parquet or .npz into an xclp.data.party_table.PartyData (docs/design.md §9).

- CSV and Parquet go through pyarrow's streaming readers (multi-threaded CSV parsing, typed
  columns): batches are written straight into one preallocated float64 matrix, so memory stays
  near the size of that matrix. A cell pyarrow cannot read sends the file through a line-by-line
  diagnosis that names the line, column and value (slow, but only on the way to an error).
- Feature cells that are empty (or NA, NaN, null) are *missing* and read as NaN: a job with
  `impute = "mean"` fills them with the pooled mean, any other job refuses them (xclp.data.prep).
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

from xclp.data.columns import (
    DEFAULT_LABEL,
    Collector,
    DefaultLabel,
    TextFeature,
    check_columns,
    check_unique_ids,
    feature_matrix,
    roles,
)
from xclp.data.party_table import NULL_CELLS, Labels, Locator, PartyData, csv_records
from xclp.data.validation import UNLABELED
from xclp.errors import InvalidInput

__all__ = ["DEFAULT_LABEL", "DELIMITERS", "DefaultLabel", "Labels", "PartyData", "TextFeature", "from_arrow", "load",
           "read_any"]

DELIMITERS = ",;\t|"


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
    check_columns(columns, path)
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


def _sniff(header_line: str) -> str:
    """The delimiter of a header line: the candidate that splits it most (a comma if none does)."""
    counts = {d: header_line.count(d) for d in DELIMITERS}
    best = max(counts, key=lambda d: counts[d])
    return best if counts[best] else ","


def read_header(path: Path, delimiter: str | None) -> tuple[list[str], str, str]:
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


def _load_csv(path: Path, *, label_column: str | None, id_column: str | None, delimiter: str | None,
              categorical: Mapping[str, Sequence[str]]) -> PartyData:
    import pyarrow as pa
    import pyarrow.csv as pacsv

    header, sep, hint = read_header(path, delimiter)
    try:
        features, label, ident = roles(header, path, label_column, id_column, hint, categorical)
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
        table = Collector(_row_bound(path), [(names[i], header[i], categorical.get(header[i])) for i in features],
                           names[label] if label is not None else None, names[ident] if ident is not None else None,
                           where, id_name=header[ident] if ident is not None else None)
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
    features, label, ident = roles(header, name, label_column, id_column, "", categorical)
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
    table = Collector(rows, [(n, n, categorical.get(n)) for n in names],
                       header[label] if label is not None else None, header[ident] if ident is not None else None,
                       where, id_name=header[ident] if ident is not None else None)
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
