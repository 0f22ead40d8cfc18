"""Model files a party writes after a job and `predict`/`query` read (DESIGN §8).

A model file is an .npz (no pickles) holding the job type, its parameters (JSON), the data
dimension, the job's common seed (so the party can rebuild the FlyHash / RACE hash functions —
the file is as confidential as the model) and the aggregate. Written atomically: a temp file in
the same directory, then os.replace, so a reader never sees half a file.
"""

from __future__ import annotations

import io
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from xclp.errors import InvalidInput
from xclp.runtime import write_atomic
from xclp.flynn import FlyHash, FlyNNModel
from xclp.race import RaceClassifier, RaceHashes
from xclp.v1.jobs import FlynnJobParams, JobParams, RaceJobParams, params_from_json, params_json


@dataclass(frozen=True)
class ModelFile:
    """job_type "flynn": aggregate = counts float64[C, m]; "race": sketch(es) float64[(C,) R, W]."""

    job_type: str
    params: JobParams
    dim: int
    seed: bytes
    aggregate: np.ndarray

    def save(self, path: str | os.PathLike[str]) -> Path:
        buf = io.BytesIO()
        np.savez(buf, job_type=np.array(self.job_type), params_json=np.array(params_json(self.params)),
                 dim=np.array(self.dim, dtype=np.int64), seed=np.frombuffer(self.seed, dtype=np.uint8),
                 aggregate=self.aggregate)
        return write_atomic(path, buf.getvalue())

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> ModelFile:
        try:
            with np.load(path, allow_pickle=False) as npz:
                job_type = str(npz["job_type"])
                return cls(job_type, params_from_json(job_type, str(npz["params_json"])), int(npz["dim"]),
                           npz["seed"].astype(np.uint8).tobytes(), np.array(npz["aggregate"]))
        except (OSError, KeyError, ValueError) as exc:
            if isinstance(exc, InvalidInput):
                raise
            raise InvalidInput(f"{path} is not an xclp model file: {exc}") from None

    def flynn(self) -> FlyNNModel:
        p = self.params
        if not isinstance(p, FlynnJobParams):
            raise InvalidInput(f"this is a {self.job_type} model, not a FlyNN model")
        flyhash = FlyHash.from_seed(self.seed, p.method_params(self.dim))
        return FlyNNModel(self.aggregate, p.gamma, flyhash)

    def race_hashes(self) -> RaceHashes:
        p = self.params
        if not isinstance(p, RaceJobParams):
            raise InvalidInput(f"this is a {self.job_type} model, not a RACE model")
        return RaceHashes.from_seed(self.seed, p.method_params(), self.dim)

    def race_classifier(self) -> RaceClassifier:
        if self.aggregate.ndim != 3:
            raise InvalidInput("this RACE model is a KDE sketch; it was trained without n_classes")
        return RaceClassifier(self.race_hashes(), self.aggregate)
