"""Job specifications as they travel in `JobSpec.params_json` (the parameter half of the wire contract).

The coordinator validates a job's parameters when it loads the job file; every party validates
them again when it receives the spec, and derives from them the exact dtype and shape of what it
will push. The data dimension is not a parameter: it comes from the parties' data summaries.

Ring choice (DESIGN §6): exact counts travel in Z_2^32 (uint32); DP variants in Z_2^64 (uint64):
FlyNN's per-party release is real-valued (Laplace noise), so it is encoded in fixed point
(crypto/fixedpoint.py, two's complement, `frac_bits` fractional bits); RACE's distributed
discrete-Laplace shares are signed integers, encoded as int64 two's complement.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from xclp.errors import ConfigError

JOB_TYPES = ("flynn", "race")


def _int(params: Mapping[str, Any], key: str, default: int | None = None, *, low: int = 1) -> int:
    value = params.get(key, default)
    if value is None:
        raise ConfigError(f"job parameter {key!r} is required")
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ConfigError(f"job parameter {key!r} must be an integer >= {low}, got {value!r}")
    return value


def _float(params: Mapping[str, Any], key: str, default: float | None = None) -> float | None:
    value = params.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"job parameter {key!r} must be a finite number, got {value!r}")
    return float(value)


def _no_extra(params: Mapping[str, Any], allowed: set[str], job_type: str) -> None:
    extra = sorted(set(params) - allowed)
    if extra:
        raise ConfigError(f"unknown {job_type} job parameter(s): {', '.join(extra)}; allowed: {', '.join(sorted(allowed))}")


@dataclass(frozen=True)
class FlynnJob:
    """FlyNN (DESIGN §6): m, s, rho, gamma as in xclp.flynn.FlyNNParams; tie_seed for predictions.

    DP (paper 001 Alg. 2) when `epsilon` is set: each party releases T noisy entries.
    """

    n_classes: int
    m: int
    s: int
    rho: int
    gamma: float = 0.0
    tie_seed: int = 0
    epsilon: float | None = None
    T: int | None = None
    frac_bits: int = 24

    def __post_init__(self) -> None:
        if self.n_classes < 2:
            raise ConfigError("n_classes must be >= 2")
        if self.rho > self.m:
            raise ConfigError(f"rho = {self.rho} exceeds m = {self.m}")
        if not 0.0 <= self.gamma < 1.0:
            raise ConfigError(f"gamma must be in [0, 1), got {self.gamma}")
        if (self.epsilon is None) != (self.T is None):
            raise ConfigError("DP FlyNN needs both epsilon and T (or neither)")
        if self.epsilon is not None and self.epsilon <= 0:
            raise ConfigError(f"epsilon must be > 0, got {self.epsilon}")
        if not 0 <= self.frac_bits <= 40:
            raise ConfigError(f"frac_bits must be in [0, 40], got {self.frac_bits}")

    @property
    def private(self) -> bool:
        return self.epsilon is not None

    def wire(self, dim: int) -> tuple[np.dtype[Any], tuple[int, ...]]:
        """dtype and shape every party pushes in the sum step."""
        return np.dtype("<u8" if self.private else "<u4"), (self.n_classes, self.m)

    @classmethod
    def parse(cls, params: Mapping[str, Any]) -> FlynnJob:
        _no_extra(params, {"n_classes", "m", "s", "rho", "gamma", "tie_seed", "epsilon", "T", "frac_bits"}, "flynn")
        T = params.get("T")
        return cls(
            n_classes=_int(params, "n_classes", low=2), m=_int(params, "m"), s=_int(params, "s"),
            rho=_int(params, "rho"), gamma=_float(params, "gamma", 0.0) or 0.0,
            tie_seed=_int(params, "tie_seed", 0, low=0), epsilon=_float(params, "epsilon"),
            T=None if T is None else _int(params, "T"), frac_bits=_int(params, "frac_bits", 24, low=0),
        )


@dataclass(frozen=True)
class RaceJob:
    """RACE (DESIGN §6): rows R, width W, family "srp"|"l2", p, bandwidth as in xclp.race.RaceParams.

    n_classes = 0 builds one KDE sketch of all rows; n_classes >= 2 one sketch per class from the
    labeled rows (RaceClassifier). With `epsilon`, every party adds a distributed discrete-Laplace
    share of scale R/ε so only the noised aggregate is ever released.
    """

    rows: int
    width: int
    family: str = "srp"
    p: int = 1
    bandwidth: float = 1.0
    n_classes: int = 0
    epsilon: float | None = None

    def __post_init__(self) -> None:
        if self.family not in ("srp", "l2"):
            raise ConfigError(f"family must be 'srp' or 'l2', got {self.family!r}")
        if self.n_classes == 1 or self.n_classes < 0:
            raise ConfigError("n_classes must be 0 (KDE sketch) or >= 2 (classifier)")
        if self.epsilon is not None and self.epsilon <= 0:
            raise ConfigError(f"epsilon must be > 0, got {self.epsilon}")

    @property
    def private(self) -> bool:
        return self.epsilon is not None

    def wire(self, dim: int) -> tuple[np.dtype[Any], tuple[int, ...]]:
        lead = (self.n_classes,) if self.n_classes else ()
        return np.dtype("<u8" if self.private else "<u4"), (*lead, self.rows, self.width)

    @classmethod
    def parse(cls, params: Mapping[str, Any]) -> RaceJob:
        _no_extra(params, {"rows", "width", "family", "p", "bandwidth", "n_classes", "epsilon"}, "race")
        family = params.get("family", "srp")
        return cls(
            rows=_int(params, "rows"), width=_int(params, "width"), family=str(family),
            p=_int(params, "p", 1), bandwidth=_float(params, "bandwidth", 1.0) or 1.0,
            n_classes=_int(params, "n_classes", 0, low=0), epsilon=_float(params, "epsilon"),
        )


JobParams = FlynnJob | RaceJob


def parse_params(job_type: str, params: Mapping[str, Any]) -> JobParams:
    if job_type == "flynn":
        return FlynnJob.parse(params)
    if job_type == "race":
        return RaceJob.parse(params)
    raise ConfigError(f"unknown job type {job_type!r}; known: {', '.join(JOB_TYPES)}")


def params_json(params: JobParams) -> str:
    return json.dumps({k: v for k, v in asdict(params).items() if v is not None}, sort_keys=True)


def params_from_json(job_type: str, text: str) -> JobParams:
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"job parameters are not valid JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise ConfigError("job parameters must be a JSON object")
    return parse_params(job_type, raw)
