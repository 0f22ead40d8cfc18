"""Model files a party writes after a job and `predict`/`query` read (docs/design.md §9).

A model file is an .npz (no pickles) holding the job type, its parameters (JSON), the data
dimension, the job's common seed (so the party can rebuild the FlyHash / RACE hash functions —
the file is as confidential as the model), the aggregate, and, when the job prepared the data
(docs/design.md §8), the pooled means, standard deviations and kept columns, so new rows are prepared
the same way, and the feature column names the model expects. Written atomically: a temp file in
the same directory, then os.replace, so a reader never sees half a file.
"""

from __future__ import annotations

import io
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from xclp.data.party_table import PartyData
from xclp.data.prep import Scaling
from xclp.errors import InvalidInput
from xclp.runtime import write_atomic
from xclp.v1.params import JobParams
from xclp.v1.registry import ModelKind, get, params_from_json, params_json


@dataclass(frozen=True)
class ModelFile:
    """The aggregate by the job type's model kind (xclp.v1.registry): FLYNN counts float64[C, m];
    RACE sketch(es) float64[(C,) R, W]; NETWORK the parameters θ float64[n_params] (xclp.nn, layer
    sizes from the params)."""

    job_type: str
    params: JobParams
    dim: int  # features the model works on (after preparation)
    seed: bytes
    aggregate: np.ndarray
    scaling: Scaling | None = None
    columns: tuple[str, ...] = ()  # the table's feature columns at training (empty: unnamed)

    def save(self, path: str | os.PathLike[str]) -> Path:
        buf = io.BytesIO()
        arrays: dict[str, Any] = {
            "job_type": np.array(self.job_type), "params_json": np.array(params_json(self.params)),
            "dim": np.array(self.dim, dtype=np.int64), "seed": np.frombuffer(self.seed, dtype=np.uint8),
            "aggregate": self.aggregate}
        arrays.update(self.scaling.to_arrays() if self.scaling is not None else {})
        if self.columns:
            arrays["columns"] = np.array(self.columns, dtype=str)
        np.savez(buf, **arrays)
        return write_atomic(path, buf.getvalue())

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> ModelFile:
        try:
            with np.load(path, allow_pickle=False) as npz:
                job_type = str(npz["job_type"])
                arrays = {k: np.array(npz[k]) for k in npz.files}
                return cls(job_type, params_from_json(job_type, str(arrays["params_json"])), int(arrays["dim"]),
                           arrays["seed"].astype(np.uint8).tobytes(), arrays["aggregate"], Scaling.from_arrays(arrays),
                           tuple(str(c) for c in arrays["columns"]) if "columns" in arrays else ())
        except (OSError, KeyError, ValueError, IndexError) as exc:
            if isinstance(exc, InvalidInput):
                raise
            raise InvalidInput(f"{path} is not an xclp model file: {exc}") from None

    def features(self, data: PartyData) -> np.ndarray:
        """float64[n, dim]: new rows prepared as the training rows were (same columns, the pooled
        imputation and scaling, the same constant columns dropped)."""
        width = len(self.columns) or (self.scaling.mean.shape[0] if self.scaling is not None else self.dim)
        if data.X.shape[1] != width:
            raise InvalidInput(f"{data.where.path or 'the data'} has {data.X.shape[1]} feature columns; the model was "
                               f"trained on {width}" + (f": {', '.join(self.columns)}" if self.columns else ""))
        if self.columns and data.columns and data.columns != self.columns:
            diff = next(j for j, (a, b) in enumerate(zip(data.columns, self.columns)) if a != b)
            raise InvalidInput(f"{data.where.path or 'the data'}: feature column {diff + 1} is {data.columns[diff]!r}; "
                               f"the model was trained with {self.columns[diff]!r} there (columns in order: "
                               f"{', '.join(self.columns)})")
        data.check_missing(impute=self.scaling is not None and self.scaling.impute,
                           hint="the model was trained without impute = \"mean\", so fill or drop them")
        return self.scaling.apply(data.X) if self.scaling is not None else data.X

    @property
    def class_names(self) -> tuple[str, ...] | None:
        return self.params.classes

    @property
    def kind(self) -> ModelKind | None:
        return get(self.job_type).model

    def loaded(self) -> Any:
        """What `predict` or `query` use of this file: the job type's model loader makes it
        (xclp.v1.registry: a FlyNN or network predictor, RACE hashes and sketch)."""
        return get(self.job_type).load_model(self)

    @property
    def n_classes(self) -> int:
        return self.params.label_classes

    def predict(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """Classes int64[n] of a FlyNN or network model for prepared rows (`features`), and a
        network's confidences float64[n] (None for FlyNN, whose ties a seeded draw breaks)."""
        if self.kind not in (ModelKind.FLYNN, ModelKind.NETWORK):
            raise InvalidInput(f"this is a {self.job_type} model, which predicts no classes")
        predictor: Predictor = self.loaded()
        return predictor.predict(X)


class Predictor(Protocol):
    """A FLYNN or NETWORK model as its loader makes it."""

    def predict(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]: ...
