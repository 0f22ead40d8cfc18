"""A checkpoint's bytes: JSON-able `meta` and named arrays as one .npz, no pickles. The coordinator's
run checkpoints (server/resume.py) and a party's sealed run state (client/run_state.py) use it."""

from __future__ import annotations

import io
import json
import zipfile
from dataclasses import dataclass
from typing import Any

import numpy as np

from xclp.data.prep import Scaling
from xclp.errors import InvalidInput

FORMAT = 2  # 2: an XCLP run's state keeps its resolved parameters (XclpJobParams.resolved); 1 is refused


@dataclass
class Saved:
    """One checkpoint: `meta` (with its "format") and named arrays."""

    meta: dict[str, Any]
    arrays: dict[str, np.ndarray]

    def to_bytes(self) -> bytes:
        out = io.BytesIO()
        arrays = {"__meta__": np.frombuffer(json.dumps(self.meta).encode(), dtype=np.uint8), **self.arrays}
        np.savez(out, allow_pickle=False, **arrays)
        return out.getvalue()

    @classmethod
    def from_bytes(cls, data: bytes, format: int = FORMAT) -> Saved:
        try:
            with np.load(io.BytesIO(data), allow_pickle=False) as z:
                arrays = {k: z[k] for k in z.files}
            meta = json.loads(arrays.pop("__meta__").tobytes().decode())
        except (ValueError, OSError, KeyError, EOFError, zipfile.BadZipFile) as exc:
            raise InvalidInput(f"not a readable checkpoint: {exc}") from None
        if not isinstance(meta, dict):
            raise InvalidInput("not a readable checkpoint: its meta is not a table")
        if meta.get("format") != format:
            raise OtherFormat(f"a checkpoint of another format ({meta.get('format')}), written by another version: "
                              f"this version reads format {format}")
        return cls(meta, arrays)


class OtherFormat(InvalidInput):
    """A checkpoint that reads, but in a format another version wrote (never misread as this one's)."""


def with_scaling(saved: Saved, scaling: Scaling | None) -> Saved:
    """`saved` with the pooled preparation (docs/design.md §8), if any: how in `meta["scaling"]`, the
    vectors as arrays "scaling.*" (copies: a checkpoint is taken under a lock and written after)."""
    if scaling is None:
        return saved
    meta = {**saved.meta, "scaling": {"standardise": scaling.standardise, "impute": scaling.impute}}
    return Saved(meta, saved.arrays | {"scaling.mean": scaling.mean.copy(), "scaling.std": scaling.std.copy(),
                                       "scaling.kept": scaling.kept.copy()})


def scaling_of(saved: Saved) -> Scaling | None:
    """The pooled preparation `with_scaling` wrote, or None."""
    how = saved.meta.get("scaling")
    if how is None:
        return None
    a = saved.arrays
    return Scaling(a["scaling.mean"], a["scaling.std"], a["scaling.kept"].astype(bool), bool(how["standardise"]),
                   bool(how["impute"]))
