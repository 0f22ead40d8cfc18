"""Which data set a party's table is: its name in the party's privacy ledger (docs/privacy.md,
"What makes two files one data set"; docs/threat-model.md).

The name is a SHA-256 over the table *as read*, before any job touches it: no job's `classes`,
categorical encoding, standardisation or imputation enters it, so that a coordinator cannot make
one table look like another by changing a parameter. Its canonical form:

- every column the party reads, by role and name (features by name, then the label and id
  columns by role), in name order: the column order of the file does not count;
- the rows in the order of their ids (unique, checked on reading): the row order of the file does
  not count when the table has an id column (without one, ids are row numbers, so it does);
- each cell as a number where it reads as one ("1", "1.0" and "1e0" are one value; -0 is 0; every
  empty cell is the same empty cell), otherwise as its text with the surrounding spaces trimmed.

So a re-export that keeps the cells' values (in any row or column order, with any number
formatting) is the same data set; a changed, added or removed row, column or label is another.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence

import numpy as np

from xclp.data.party_table import PartyData

__all__ = ["ID", "LABEL", "data_set_digest", "table_digest"]

LABEL = "\x00label"  # the label column, by role (its name is the party's choice, not a feature's)
ID = "\x00id"  # the id column, by role
_TAG = b"xclp/data-set/v2"

Column = np.ndarray | Sequence[str | None]  # float64[n] (NaN empty), or cells as text (None empty)


def table_digest(columns: Mapping[str, Column], ids: Sequence[str]) -> bytes:
    """The data set's 32-byte name (module docstring): `columns` maps a feature's name, or LABEL,
    to its cells in the table's row order; `ids` are the rows' ids in that order."""
    n = len(ids)
    order = np.argsort(np.asarray(ids, dtype=object).astype(str), kind="stable")
    h = hashlib.sha256(_TAG)
    _update(h, b"rows", n.to_bytes(8, "big"))
    _update(h, ID.encode(), _text([ids[i] for i in order]))
    for name in sorted(columns):
        values = columns[name]
        if len(values) != n:
            raise ValueError(f"column {name!r} has {len(values)} cells for {n} rows")
        _update(h, name.encode(), _cells(values, order))
    return h.digest()


def _update(h: hashlib._Hash, key: bytes, value: bytes) -> None:
    h.update(len(key).to_bytes(8, "big") + key + len(value).to_bytes(8, "big") + value)


def _cells(values: Column, order: np.ndarray) -> bytes:
    if isinstance(values, np.ndarray) and values.dtype.kind in "fiub":
        return b"f" + _numbers(values.astype(np.float64)[order])
    cells = [values[i] for i in order]
    numbers = _as_numbers(cells)
    if numbers is not None:
        return b"f" + _numbers(numbers)
    return b"s" + _text(cells)


def _as_numbers(cells: Sequence[str | None]) -> np.ndarray | None:
    """float64[n] when every non-empty cell reads as a number (NaN for an empty one), else None."""
    levels: dict[str | None, float] = {}
    for cell in set(cells):
        text = None if cell is None else cell.strip()
        if text is None or text == "":
            levels[cell] = np.nan
            continue
        try:
            levels[cell] = float(text)
        except ValueError:
            return None
    return np.array([levels[c] for c in cells], dtype=np.float64)


def _numbers(v: np.ndarray) -> bytes:
    v = np.where(v == 0, 0.0, v)  # -0 is 0
    v = np.where(np.isnan(v), np.nan, v)  # one empty cell, whatever NaN payload it was read as
    return np.ascontiguousarray(v, dtype="<f8").tobytes()


def _text(cells: Sequence[str | None]) -> bytes:
    out = bytearray()
    for cell in cells:
        if cell is None or cell.strip() == "":
            out += b"\xff" * 8  # empty: no length a text can have
        else:
            raw = cell.strip().encode()
            out += len(raw).to_bytes(8, "big") + raw
    return bytes(out)


def data_set_digest(data: PartyData) -> bytes:
    """The name of a table given as a PartyData (arrays, or one built by hand), the same as
    reading it from a file would give: its features by name (or by position, "#1", ... when
    unnamed), its labels as written (class names, or numbers with −1 unlabeled) and its ids. A
    table read from a file is named here too, when asked (a party without a ledger never asks),
    but one with categorical columns carries its name from the reading
    (`PartyData.dataset_digest`), since its matrix holds the job's encoding of those columns."""
    if data.dataset_digest is not None:
        return data.dataset_digest
    names = data.columns or tuple(f"#{j + 1}" for j in range(data.X.shape[1]))
    columns: dict[str, Column] = {name: data.X[:, j] for j, name in enumerate(names)}
    if data.labels is not None:
        cells = np.array([*data.labels.values, None], dtype=object)
        columns[LABEL] = list(cells[data.labels.codes])
    elif data.y is not None:
        columns[LABEL] = np.where(data.y < 0, np.nan, data.y.astype(np.float64))
    return table_digest(columns, data.ids)
