"""What a set of tables needs from a job before it can run on them (`xclp-server federation new`):
which feature columns hold text (to declare categorical, with their levels), which have empty
cells (to impute), and how far apart the numeric columns' scales are (to standardise).

The tables are read as text, every cell, so that nothing a job would refuse stops the survey;
only their column names and these summaries leave this module, never a value but the text
columns' levels (which the job file must list anyway).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from xclp.data.columns import roles
from xclp.data.party_table import NULL_CELLS
from xclp.errors import InvalidInput

__all__ = ["MAX_LEVELS", "STANDARDISE_RATIO", "Survey", "survey"]

# a column whose standard deviation is this many times another's dominates the cosine similarity
# XCLP's LSH estimates (and FlyNN's projections): the scaffold proposes `standardise = true`
STANDARDISE_RATIO = 10.0
MAX_LEVELS = 64  # a text column with more distinct values is no category (an id, a free text)


@dataclass
class Survey:
    """Over every table: the feature columns in order, the text ones' levels (sorted), the empty
    cells per column, and each numeric column's largest standard deviation."""

    columns: tuple[str, ...] = ()
    levels: dict[str, list[str]] = field(default_factory=dict)
    empty: dict[str, int] = field(default_factory=dict)
    spread: dict[str, float] = field(default_factory=dict)

    @property
    def scale_ratio(self) -> float:
        """The largest numeric column's standard deviation over the smallest non-zero one's."""
        spreads = [s for c, s in self.spread.items() if c not in self.levels and s > 0]
        return max(spreads) / min(spreads) if len(spreads) > 1 else 1.0


def survey(paths: Sequence[Path], label_column: str | None, id_column: str | None) -> Survey:
    """Survey CSV or Parquet tables (module docstring); InvalidInput if their feature columns differ."""
    import pyarrow as pa
    import pyarrow.compute as pc

    out = Survey()
    for path in paths:
        table = _as_text(Path(path))
        header = [str(n) for n in table.schema.names]
        features, _, _ = roles(header, path, label_column, id_column, "", {})
        names = tuple(header[j] for j in features)
        if out.columns and names != out.columns:
            raise InvalidInput(f"{path} has the feature columns {', '.join(names)}, not those of the first table "
                               f"({', '.join(out.columns)}): every party needs the same columns")
        out.columns = names
        for name in names:
            column = pc.utf8_trim_whitespace(table.column(name))
            column = pc.if_else(pc.is_in(column, value_set=pa.array(list(NULL_CELLS))), None, column)
            out.empty[name] = out.empty.get(name, 0) + column.null_count
            try:
                numbers = pc.cast(column, pa.float64())
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                values = {v for v in column.to_pylist() if v is not None}
                out.levels[name] = sorted(set(out.levels.get(name, [])) | values)
                continue
            std = pc.stddev(numbers).as_py()
            if std is not None and math.isfinite(std):
                out.spread[name] = max(out.spread.get(name, 0.0), std)
    for name in out.levels:  # a column numeric in one table and text in another is text
        out.spread.pop(name, None)
    return out


def _as_text(path: Path) -> Any:  # a pyarrow.Table (pyarrow has no type information)
    """A pyarrow Table of every cell as text."""
    import pyarrow as pa
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    from xclp.data.tables import read_header

    try:
        if path.suffix in (".parquet", ".pq"):
            table = pq.read_table(path)
            return pa.table({n: table.column(n).cast(pa.string()) for n in table.schema.names})
        header, sep, _ = read_header(path, None)
        return pacsv.read_csv(path, parse_options=pacsv.ParseOptions(delimiter=sep, newlines_in_values=True),
                              convert_options=pacsv.ConvertOptions(column_types={h: pa.string() for h in header},
                                                                   strings_can_be_null=False))
    except (OSError, pa.ArrowException) as exc:
        raise InvalidInput(f"cannot read {path}: {exc}") from None
