"""The masked all-reduce jobs, FlyNN and RACE (docs/design.md §6): their parameters and their one sum.

After the seed (and the moments phase if the job prepares) every party pushes one array in the
masked step "sum" (dtype and shape from `wire`), reveals its self mask in "sum_reveal" once the
coordinator holds every array, and gets the aggregate as message "result".

Ring choice (docs/design.md §6): exact counts travel in Z_2^32 (uint32); DP variants in Z_2^64 (uint64):
FlyNN's per-party release is real-valued (Laplace noise), so it is encoded in fixed point
(crypto/fixedpoint.py, two's complement, `frac_bits` fractional bits); RACE's distributed
discrete-Laplace shares are signed integers, encoded as int64 two's complement.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, cast

import numpy as np

from xclp.errors import ConfigError
from xclp.flynn import FlyNNParams
from xclp.race import RaceParams
from xclp.v1.params import (
    JobParams,
    check_names,
    data_params,
    float_param,
    int_param,
    method,
    n_classes_param,
    optional_float,
    param,
    str_param,
)

SUM_STEP = "sum"
SUM_PURPOSE = SUM_STEP  # the pairwise-mask purpose (HKDF info) of the sum
RESULT_MSG = "result"


COUNT_RING = 2**32  # exact counts travel as uint32, summed mod 2^32 (docs/design.md §6: 32 bits where 32 suffice)


def check_count_ring(private: bool, most: int, what: str) -> None:
    """Exact counts never exceed the rows in all; refuse caps that would let the sum wrap."""
    if not private and most >= COUNT_RING:
        raise ConfigError(f"with up to {most} rows in all, the {what} counts could pass {COUNT_RING - 1} and wrap in "
                          f"the 32-bit ring the exact sum travels in: cap the rows below {COUNT_RING} "
                          "(max_total_rows, or max_rows_per_party × the expected parties)")


@dataclass(frozen=True)
class FlynnJobParams(JobParams):
    """FlyNN (docs/design.md §6): m, s, rho, gamma as in xclp.flynn.FlyNNParams; tie_seed for predictions.

    DP (Ram & Sinha 2022 Alg. 2) when `epsilon` is set: each party releases T noisy entries.
    """

    n_classes: int = param("number of classes; labels are 0 .. n_classes − 1 (set by `classes` when that is given)",
                           ">= 2")
    m: int = param("FlyHash dimension (the paper uses 256 × the number of features)", ">= rho", "Ram & Sinha 2022 §3")
    s: int = param("ones per row of the FlyHash projection (the paper: ⌊0.3 × features⌋)", "1 .. features",
                   "Ram & Sinha 2022, supplement Table 6")
    rho: int = param("bits set in each hash (the paper: 32)", "1 .. m")
    gamma: float = param("Fly Bloom Filter decay; 0 makes the filters binary", "[0, 1)", default=0.0)
    tie_seed: int = param("seed of the draw that breaks prediction ties", ">= 0", default=0)
    epsilon: float | None = param("total privacy budget ε; with T, each party releases a DP model (off when unset)",
                                  "> 0", "Ram & Sinha 2022 Alg. 2", default=None)
    T: int | None = param("count entries each party releases under DP", "1 .. n_classes × m", default=None)
    frac_bits: int = param("fractional bits of the fixed-point ring for DP releases", "0 .. 40", default=24)

    def __post_init__(self) -> None:
        if self.n_classes < 2:
            raise ConfigError("n_classes must be >= 2")
        self._check_data(self.n_classes)
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
        self.method_params(self.s)  # m, s, rho, gamma as FlyNN checks them; s <= dim once the data is known

    def check_dim(self, dim: int) -> None:
        self.method_params(dim)  # s ones per row of the projection need s <= d columns

    def method_params(self, dim: int) -> FlyNNParams:
        """The FlyNN parameters for data of `dim` columns (the dimension comes from the parties)."""
        return method(lambda: FlyNNParams(dim, self.m, self.s, self.rho, self.gamma))

    @property
    def private(self) -> bool:
        return self.epsilon is not None

    @property
    def label_classes(self) -> int:
        return self.n_classes

    @property
    def needs_labels(self) -> bool:
        return self.n_classes > 0  # class counts (RACE without classes: a density of every row)

    @property
    def release_epsilon(self) -> float | None:
        return self.epsilon

    def check_rows(self, most: int) -> None:
        check_count_ring(self.private, most, "FlyNN")

    def wire(self, dim: int) -> tuple[np.dtype[Any], tuple[int, ...]]:
        """dtype and shape every party pushes in the sum step."""
        return np.dtype("<u8" if self.private else "<u4"), (self.n_classes, self.m)

    @classmethod
    def parse(cls, raw: Mapping[str, Any]) -> FlynnJobParams:
        check_names(raw, frozenset({"n_classes", "m", "s", "rho", "gamma", "tie_seed", "epsilon", "T", "frac_bits"}),
                    "flynn")
        T = raw.get("T")
        return cls(
            n_classes=n_classes_param(raw), m=int_param(raw, "m"), s=int_param(raw, "s"), rho=int_param(raw, "rho"),
            gamma=float_param(raw, "gamma", 0.0), tie_seed=int_param(raw, "tie_seed", 0, low=0),
            epsilon=optional_float(raw, "epsilon"), T=None if T is None else int_param(raw, "T"),
            frac_bits=int_param(raw, "frac_bits", 24, low=0), **data_params(raw),
        )


@dataclass(frozen=True)
class RaceJobParams(JobParams):
    """RACE (docs/design.md §6): rows R, width W, family "srp"|"l2", p, bandwidth as in xclp.race.RaceParams.

    n_classes = 0 builds one KDE sketch of all rows; n_classes >= 2 one sketch per class from the
    labeled rows (RaceClassifier). With `epsilon`, every party adds a distributed discrete-Laplace
    share of scale R/ε so only the noised aggregate is ever released.
    """

    rows: int = param("R, repetitions (rows of the sketch); more rows, less variance", ">= 1",
                      "Coleman & Shrivastava 2021 §2.4")
    width: int = param("W, buckets per row", ">= 2^p for srp")
    family: str = param('LSH family: "srp" (angular kernel (1 − θ/π)^p) or "l2" (p-stable, Euclidean)',
                        '"srp", "l2"', default="srp")
    p: int = param("sign bits per row for srp (a sharper kernel with more bits)", "1 .. 24", default=1)
    bandwidth: float = param("bucket width r of the l2 family (a wider kernel with larger r)", "> 0", default=1.0)
    n_classes: int = param("0: one KDE sketch of all rows; >= 2: one sketch per class of the labeled rows",
                           "0 or >= 2", default=0)
    epsilon: float | None = param("ε of the distributed discrete-Laplace release (off when unset)", "> 0",
                                  "docs/privacy.md", default=None)

    def __post_init__(self) -> None:
        if self.family not in ("srp", "l2"):
            raise ConfigError(f"family must be 'srp' or 'l2', got {self.family!r}")
        if self.n_classes == 1 or self.n_classes < 0:
            raise ConfigError("n_classes must be 0 (KDE sketch) or >= 2 (classifier)")
        self._check_data(self.n_classes if self.classes is not None else 0)
        if self.epsilon is not None and self.epsilon <= 0:
            raise ConfigError(f"epsilon must be > 0, got {self.epsilon}")
        if not self.bandwidth > 0:
            raise ConfigError(f"bandwidth must be > 0, got {self.bandwidth}")
        self.method_params()

    def method_params(self) -> RaceParams:
        family = cast(Literal["srp", "l2"], self.family)  # checked in __post_init__
        return method(lambda: RaceParams(self.rows, self.width, family, self.p, self.bandwidth))

    @property
    def private(self) -> bool:
        return self.epsilon is not None

    @property
    def label_classes(self) -> int:
        return self.n_classes

    @property
    def needs_labels(self) -> bool:
        return self.n_classes > 0  # class counts (RACE without classes: a density of every row)

    @property
    def release_epsilon(self) -> float | None:
        return self.epsilon

    def check_rows(self, most: int) -> None:
        check_count_ring(self.private, most, "RACE")

    def wire(self, dim: int) -> tuple[np.dtype[Any], tuple[int, ...]]:
        lead = (self.n_classes,) if self.n_classes else ()
        return np.dtype("<u8" if self.private else "<u4"), (*lead, self.rows, self.width)

    @classmethod
    def parse(cls, raw: Mapping[str, Any]) -> RaceJobParams:
        check_names(raw, frozenset({"rows", "width", "family", "p", "bandwidth", "n_classes", "epsilon"}), "race")
        return cls(
            rows=int_param(raw, "rows"), width=int_param(raw, "width"), family=str_param(raw, "family", "srp"),
            p=int_param(raw, "p", 1), bandwidth=float_param(raw, "bandwidth", 1.0),
            n_classes=n_classes_param(raw, 0, low=0), epsilon=optional_float(raw, "epsilon"), **data_params(raw),
        )
