"""Model files a party writes after a job and `predict`/`query` read (DESIGN §9).

A model file is an .npz (no pickles) holding the job type, its parameters (JSON), the data
dimension, the job's common seed (so the party can rebuild the FlyHash / RACE hash functions —
the file is as confidential as the model), the aggregate, and, when the job prepared the data
(DESIGN §8), the pooled means, standard deviations and kept columns, so new rows are prepared
the same way, and the feature column names the model expects. Written atomically: a temp file in
the same directory, then os.replace, so a reader never sees half a file.
"""

from __future__ import annotations

import io
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from xclp.errors import InvalidInput
from xclp.flynn import FlyHash, FlyNNModel
from xclp.nn import Network
from xclp.party_table import PartyData
from xclp.prep import Scaling
from xclp.propagation import predict as predict_labels
from xclp.race import RaceClassifier, RaceHashes
from xclp.runtime import write_atomic
from xclp.v1.allreduce import FlynnJobParams, RaceJobParams
from xclp.v1.dbcl import DbclJobParams
from xclp.v1.fedavg import FedavgJobParams
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

    def _expect(self, kind: ModelKind, what: str) -> None:
        if self.kind is not kind:
            raise InvalidInput(f"this is a {self.job_type} model, not {what}")

    def flynn(self) -> FlyNNModel:
        self._expect(ModelKind.FLYNN, "a FlyNN model")
        p = self.params
        assert isinstance(p, FlynnJobParams)  # the registry's schema of a FLYNN model
        flyhash = FlyHash.from_seed(self.seed, p.method_params(self.dim))
        return FlyNNModel(self.aggregate, p.gamma, flyhash)

    def network(self) -> Network:
        self._expect(ModelKind.NETWORK, "a network trained by a fedavg or dbcl job")
        p = self.params
        assert isinstance(p, (FedavgJobParams, DbclJobParams))  # the registry's schemas of NETWORK models
        return Network(p.architecture(self.dim), np.asarray(self.aggregate, dtype=np.float64))

    def race_hashes(self) -> RaceHashes:
        self._expect(ModelKind.RACE, "a RACE model")
        p = self.params
        assert isinstance(p, RaceJobParams)  # the registry's schema of a RACE model
        return RaceHashes.from_seed(self.seed, p.method_params(), self.dim)

    @property
    def n_classes(self) -> int:
        return self.params.label_classes

    def predict(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """Classes int64[n] of a FlyNN or network model for prepared rows (`features`), and a
        network's confidences float64[n] (None for FlyNN, whose ties a seeded draw breaks)."""
        if self.kind is ModelKind.NETWORK:
            labels, confidence = predict_labels(self.network().probabilities(X))
            return labels, confidence
        flynn = self.flynn()
        assert isinstance(self.params, FlynnJobParams)
        return flynn.predict(X, tie_seed=self.params.tie_seed), None

    def race_classifier(self) -> RaceClassifier:
        if self.aggregate.ndim != 3:
            raise InvalidInput("this RACE model is a KDE sketch; it was trained without n_classes")
        return RaceClassifier(self.race_hashes(), self.aggregate)
