"""A checkpoint's bytes: JSON-able `meta` and named arrays as one .npz, no pickles. The coordinator's
run checkpoints (server/resume.py) and a party's sealed run state (client/run_state.py) use it."""

from __future__ import annotations

import io
import json
import zipfile
from dataclasses import dataclass
from typing import Any

import numpy as np

from xclp.errors import InvalidInput

FORMAT = 1


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
        if not isinstance(meta, dict) or meta.get("format") != format:
            raise InvalidInput("a checkpoint of another format than this version writes")
        return cls(meta, arrays)
