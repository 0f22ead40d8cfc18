"""Job parameter schemas as they travel in `JobSpec.params_json` (the parameter half of the wire contract).

The coordinator validates a job's parameters when it loads the job file; every party validates
them again when it receives the spec, and derives from them the exact dtype and shape of what it
will push. The data dimension is not a parameter: it comes from the parties' data summaries.

Ring choice (DESIGN §6): exact counts travel in Z_2^32 (uint32); DP variants in Z_2^64 (uint64):
FlyNN's per-party release is real-valued (Laplace noise), so it is encoded in fixed point
(crypto/fixedpoint.py, two's complement, `frac_bits` fractional bits); RACE's distributed
discrete-Laplace shares are signed integers, encoded as int64 two's complement.
XCLP (DESIGN §5) sends several arrays per job; `XclpJobParams` names its parameters, and
server/jobs/xclp.py and client/jobs/xclp.py state the dtype and shape of each step's payload.
Each schema builds the method's own parameter object (`method_params`, `graph_params`), so a value
the method would refuse is refused when the coordinator loads the job file, not after parties join.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import MISSING, asdict, dataclass, field, fields
from typing import Any

import numpy as np

from xclp.crypto.paillier import MIN_SECURE_BITS
from xclp.errors import ConfigError, InvalidInput
from xclp.dbcl import OPTIMISERS, ServerOptimiser, sketch_sizes
from xclp.fedavg import PSEUDO_LABELS
from xclp.flynn import FlyNNParams
from xclp.graph import GraphParams
from xclp.nn import SGD, Architecture
from xclp.race import RaceParams
from xclp.sketch import KINDS as SKETCH_KINDS

JOB_TYPES = ("flynn", "race", "xclp", "fedavg", "dbcl")


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


def _bool(params: Mapping[str, Any], key: str) -> bool:
    value = params.get(key, False)
    if not isinstance(value, bool):
        raise ConfigError(f"job parameter {key!r} must be true or false, got {value!r}")
    return value


# Parameters that were renamed: a job file naming the old one hears the new name.
RENAMED = {"n_bits": "lsh_bits"}


def _no_extra(params: Mapping[str, Any], allowed: set[str], job_type: str) -> None:
    for old, new in RENAMED.items():
        if old in params and new in allowed:
            raise ConfigError(f"{job_type} job parameter {old!r} is now called {new!r} (the number of LSH bits L)")
    extra = sorted(set(params) - allowed)
    if extra:
        raise ConfigError(f"unknown {job_type} job parameter(s): {', '.join(extra)}; allowed: {', '.join(sorted(allowed))}")


_REQUIRED: Any = MISSING


def _p(meaning: str, range_: str, see: str = "", *, default: Any = _REQUIRED, kw_only: bool = False) -> Any:
    """A schema field with the text of the parameter reference (README "Job parameters")."""
    return field(default=default, kw_only=kw_only, metadata={"meaning": meaning, "range": range_, "see": see})


IMPUTE = ("none", "mean")
DATA_KEYS = {"classes", "standardise", "impute", "categorical"}
MAX_CLASSES = 4096


@dataclass(frozen=True)
class DataParams:
    """How every party prepares its table before the job's first step (DESIGN §8); any job type.

    classes: label cells hold these names, numbered by their order here on every party.
    standardise / impute: one masked sum of (n, Σx, Σx²) per feature (the "moments" step, DESIGN
    §6.1); every party scales with the pooled mean and standard deviation and/or fills missing
    cells with the pooled mean; features constant everywhere are dropped by every party alike.
    """

    classes: tuple[str, ...] | None = _p("class names, in the order that numbers them; label cells then hold "
                                         "these names (unset: label cells are class numbers)",
                                         "distinct, non-empty", "README \"Your data\"", default=None, kw_only=True)
    standardise: bool = _p("scale every feature by the pooled mean and standard deviation of all parties "
                           "(the coordinator learns those, nothing per party)", "true, false", "DESIGN §8",
                           default=False, kw_only=True)
    impute: str = _p('"mean": fill empty or NaN feature cells with the pooled mean; "none": refuse them',
                     '"none", "mean"', "DESIGN §8", default="none", kw_only=True)
    categorical: dict[str, tuple[str, ...]] | None = _p(
        "text columns as a table `[params.categorical]` of column = [categories]: each becomes one 0/1 "
        "column per category, in the declared order, on every party (CSV and Parquet)",
        "distinct, non-empty", "README \"Your data\"", default=None, kw_only=True)

    def _check_data(self, n_classes: int) -> None:
        if self.classes is not None:
            if not self.classes or any(not isinstance(c, str) or not c.strip() for c in self.classes):
                raise ConfigError("classes must be a list of non-empty names")
            if len(set(self.classes)) != len(self.classes):
                raise ConfigError(f"classes names a class twice: {list(self.classes)}")
            if len(self.classes) > MAX_CLASSES:
                raise ConfigError(f"at most {MAX_CLASSES} classes")
            if n_classes != len(self.classes):
                raise ConfigError(f"n_classes = {n_classes} but classes names {len(self.classes)}; "
                                  "leave n_classes out, it follows from classes")
        for column, categories in (self.categorical or {}).items():
            if not column or not categories or any(not c for c in categories) or len(set(categories)) != len(categories):
                raise ConfigError(f"categorical column {column!r} needs a list of distinct, non-empty categories")
        if self.impute not in IMPUTE:
            raise ConfigError(f"impute must be one of {', '.join(repr(v) for v in IMPUTE)}, got {self.impute!r}")

    @property
    def prepares(self) -> bool:
        """Whether the job runs the "moments" step before its first step."""
        return self.standardise or self.impute == "mean"


def _data(params: Mapping[str, Any]) -> dict[str, Any]:
    classes = params.get("classes")
    if classes is not None:
        if not isinstance(classes, (list, tuple)) or not all(isinstance(c, str) for c in classes):
            raise ConfigError(f"job parameter 'classes' must be a list of names, got {classes!r}")
        classes = tuple(c.strip() for c in classes)
    impute = params.get("impute", "none")
    if not isinstance(impute, str):
        raise ConfigError(f"job parameter 'impute' must be \"none\" or \"mean\", got {impute!r}")
    categorical = params.get("categorical")
    if categorical is not None:
        if not isinstance(categorical, Mapping) or not all(
                isinstance(v, (list, tuple)) and all(isinstance(c, str) for c in v) for v in categorical.values()):
            raise ConfigError("job parameter 'categorical' must be a table of column = [category names]")
        categorical = {str(k): tuple(c.strip() for c in v) for k, v in categorical.items()}
    return {"classes": classes, "standardise": _bool(params, "standardise"), "impute": impute,
            "categorical": categorical}


def _n_classes(params: Mapping[str, Any], default: int | None = None, *, low: int = 2) -> int:
    classes = params.get("classes")
    if isinstance(classes, (list, tuple)):
        default = len(classes)
    return _int(params, "n_classes", default, low=low)


@dataclass(frozen=True)
class FlynnJobParams(DataParams):
    """FlyNN (DESIGN §6): m, s, rho, gamma as in xclp.flynn.FlyNNParams; tie_seed for predictions.

    DP (paper 001 Alg. 2) when `epsilon` is set: each party releases T noisy entries.
    """

    n_classes: int = _p("number of classes; labels are 0 .. n_classes − 1 (set by `classes` when that is given)", ">= 2")
    m: int = _p("FlyHash dimension (the paper uses 256 × the number of features)", ">= rho", "paper 001 §3")
    s: int = _p("ones per row of the FlyHash projection (the paper: ⌊0.3 × features⌋)", "1 .. features",
                "paper 000 supplement Table 6")
    rho: int = _p("bits set in each hash (the paper: 32)", "1 .. m")
    gamma: float = _p("Fly Bloom Filter decay; 0 makes the filters binary", "[0, 1)", default=0.0)
    tie_seed: int = _p("seed of the draw that breaks prediction ties", ">= 0", default=0)
    epsilon: float | None = _p("total privacy budget ε; with T, each party releases a DP model (off when unset)",
                               "> 0", "paper 001 Alg. 2", default=None)
    T: int | None = _p("count entries each party releases under DP", "1 .. n_classes × m", default=None)
    frac_bits: int = _p("fractional bits of the fixed-point ring for DP releases", "0 .. 40", default=24)

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

    def method_params(self, dim: int) -> FlyNNParams:
        """The FlyNN parameters for data of `dim` columns (the dimension comes from the parties)."""
        return _method(lambda: FlyNNParams(dim, self.m, self.s, self.rho, self.gamma))

    @property
    def private(self) -> bool:
        return self.epsilon is not None

    def wire(self, dim: int) -> tuple[np.dtype[Any], tuple[int, ...]]:
        """dtype and shape every party pushes in the sum step."""
        return np.dtype("<u8" if self.private else "<u4"), (self.n_classes, self.m)

    @classmethod
    def parse(cls, params: Mapping[str, Any]) -> FlynnJobParams:
        _no_extra(params, {"n_classes", "m", "s", "rho", "gamma", "tie_seed", "epsilon", "T", "frac_bits"} | DATA_KEYS,
                  "flynn")
        T = params.get("T")
        return cls(
            n_classes=_n_classes(params), m=_int(params, "m"), s=_int(params, "s"),
            rho=_int(params, "rho"), gamma=_float(params, "gamma", 0.0) or 0.0,
            tie_seed=_int(params, "tie_seed", 0, low=0), epsilon=_float(params, "epsilon"),
            T=None if T is None else _int(params, "T"), frac_bits=_int(params, "frac_bits", 24, low=0),
            **_data(params),
        )


@dataclass(frozen=True)
class RaceJobParams(DataParams):
    """RACE (DESIGN §6): rows R, width W, family "srp"|"l2", p, bandwidth as in xclp.race.RaceParams.

    n_classes = 0 builds one KDE sketch of all rows; n_classes >= 2 one sketch per class from the
    labeled rows (RaceClassifier). With `epsilon`, every party adds a distributed discrete-Laplace
    share of scale R/ε so only the noised aggregate is ever released.
    """

    rows: int = _p("R, repetitions (rows of the sketch); more rows, less variance", ">= 1", "paper 002 §2.4")
    width: int = _p("W, buckets per row", ">= 2^p for srp")
    family: str = _p('LSH family: "srp" (angular kernel (1 − θ/π)^p) or "l2" (p-stable, Euclidean)',
                     '"srp", "l2"', default="srp")
    p: int = _p("sign bits per row for srp (a sharper kernel with more bits)", "1 .. 24", default=1)
    bandwidth: float = _p("bucket width r of the l2 family (a wider kernel with larger r)", "> 0", default=1.0)
    n_classes: int = _p("0: one KDE sketch of all rows; >= 2: one sketch per class of the labeled rows",
                        "0 or >= 2", default=0)
    epsilon: float | None = _p("ε of the distributed discrete-Laplace release (off when unset)", "> 0",
                               "DESIGN §6", default=None)

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
        return _method(lambda: RaceParams(self.rows, self.width, self.family, self.p, self.bandwidth))  # type: ignore[arg-type]

    @property
    def private(self) -> bool:
        return self.epsilon is not None

    def wire(self, dim: int) -> tuple[np.dtype[Any], tuple[int, ...]]:
        lead = (self.n_classes,) if self.n_classes else ()
        return np.dtype("<u8" if self.private else "<u4"), (*lead, self.rows, self.width)

    @classmethod
    def parse(cls, params: Mapping[str, Any]) -> RaceJobParams:
        _no_extra(params, {"rows", "width", "family", "p", "bandwidth", "n_classes", "epsilon"} | DATA_KEYS, "race")
        family = params.get("family", "srp")
        return cls(
            rows=_int(params, "rows"), width=_int(params, "width"), family=str(family),
            p=_int(params, "p", 1), bandwidth=_float(params, "bandwidth", 1.0),  # type: ignore[arg-type]
            n_classes=_n_classes(params, 0, low=0), epsilon=_float(params, "epsilon"), **_data(params),
        )


LABEL_NORMS = ("none", "party")
SOLVERS = ("auto", "dense", "cg")


@dataclass(frozen=True)
class XclpJobParams(DataParams):
    """XCLP (DESIGN §5, paper 003 Alg. 1): L = lsh_bits LSH bits, graph (k, alpha, power), Paillier
    key size, SecureRowSums fixed point and what the coordinator may learn.

    key_bits below 2048 only with `insecure_test_keys = true` (tests and quick local trials).
    SecureHamming masks are uniform mod N (perfect hiding, crypto/secure_hamming.py), so there is
    no statistical-security parameter σ; a job file naming "sigma" is refused as an unknown key.
    label_norm: "none" = one-hot Y_L (the paper), "party" = each party divides each class column by
    its own count of that class (the authors' code, per party; DESIGN §5.6). hide_label_mask: the
    coordinator sends every party the influence columns of all its rows, so it never learns which
    rows are labeled (DESIGN §5.5). solver: "auto" = dense Cholesky for small n, conjugate
    gradients for large n (xclp.graph); frac_bits: SecureRowSums fixed-point scale 2^frac_bits.
    """

    n_classes: int = _p("number of classes; labels are 0 .. n_classes − 1 (set by `classes` when that is given)", ">= 2")
    lsh_bits: int = _p("L, LSH bits per row (the paper uses 4096); more bits, closer to exact cosine",
                       "multiple of 64", "paper 003 §3", default=1024)
    k: int = _p("neighbours kept per row of the graph", "1 .. all rows − 1", default=10)
    alpha: float = _p("propagation weight α", "(0, 1)", default=0.99)
    power: float = _p("similarity exponent p in cos(π H / L)^p (the authors' code: 3; the paper's text: 1)",
                      "> 0", default=3.0)
    key_bits: int = _p("Paillier modulus size; every party runs `xclp-client run --paillier-bits` with it",
                       ">= 2048 (smaller with insecure_test_keys)", "DESIGN §5.3", default=MIN_SECURE_BITS)
    hide_label_mask: bool = _p("the coordinator does not learn which rows are labeled; each party then gets "
                               "the influence columns of all its rows", "true, false", "DESIGN §5.5", default=False)
    label_norm: str = _p('"none": one-hot labels (the paper); "party": each party divides each class column '
                         'by its own count of that class', '"none", "party"', "DESIGN §5.6", default="none")
    solver: str = _p('influence solve: "dense" Cholesky, "cg" conjugate gradients, "auto" picks by size',
                     '"auto", "dense", "cg"', default="auto")
    frac_bits: int = _p("fractional bits of the SecureRowSums fixed-point ring", "8 .. 48", default=32)
    insecure_test_keys: bool = _p("allow key_bits below 2048 (tests and quick trials only)", "true, false",
                                  default=False)

    def __post_init__(self) -> None:
        if self.n_classes < 2:
            raise ConfigError("n_classes must be >= 2")
        self._check_data(self.n_classes)
        if self.lsh_bits % 64:
            raise ConfigError(f"lsh_bits (L) must be a positive multiple of 64, got {self.lsh_bits}")
        if not 0.0 < self.alpha < 1.0:
            raise ConfigError(f"alpha must be in (0, 1), got {self.alpha}")
        if self.power <= 0:
            raise ConfigError(f"power must be > 0, got {self.power}")
        if self.key_bits % 8 or self.key_bits < 256:
            raise ConfigError(f"key_bits must be a multiple of 8 and >= 256, got {self.key_bits}")
        if self.key_bits < MIN_SECURE_BITS and not self.insecure_test_keys:
            raise ConfigError(
                f"key_bits = {self.key_bits} is below the secure {MIN_SECURE_BITS}; smaller Paillier keys "
                "are for tests only and need insecure_test_keys = true"
            )
        if self.label_norm not in LABEL_NORMS:
            raise ConfigError(
                f"label_norm must be one of {', '.join(LABEL_NORMS)}, got {self.label_norm!r} "
                "(\"pooled\" needs a secure sum of class counts first and is not offered)"
            )
        if self.solver not in SOLVERS:
            raise ConfigError(f"solver must be one of {', '.join(SOLVERS)}, got {self.solver!r}")
        if not 8 <= self.frac_bits <= 48:
            raise ConfigError(f"frac_bits must be in [8, 48], got {self.frac_bits}")
        _method(lambda: self.graph_params)

    @property
    def graph_params(self) -> GraphParams:
        return GraphParams(self.k, self.alpha, self.power)

    @property
    def normalise_labels(self) -> bool:
        return self.label_norm == "party"

    @classmethod
    def parse(cls, params: Mapping[str, Any]) -> XclpJobParams:
        allowed = {"n_classes", "lsh_bits", "k", "alpha", "power", "key_bits", "hide_label_mask",
                   "label_norm", "solver", "frac_bits", "insecure_test_keys"} | DATA_KEYS
        _no_extra(params, allowed, "xclp")
        return cls(
            n_classes=_n_classes(params), lsh_bits=_int(params, "lsh_bits", 1024, low=64),
            k=_int(params, "k", 10), alpha=_float(params, "alpha", 0.99) or 0.0,
            power=_float(params, "power", 3.0) or 0.0, key_bits=_int(params, "key_bits", MIN_SECURE_BITS),
            hide_label_mask=_bool(params, "hide_label_mask"),
            label_norm=str(params.get("label_norm", "none")), solver=str(params.get("solver", "auto")),
            frac_bits=_int(params, "frac_bits", 32), insecure_test_keys=_bool(params, "insecure_test_keys"),
            **_data(params),
        )


@dataclass(frozen=True)
class FedavgJobParams(DataParams):
    """Secure FedAvg of a small network (DESIGN §7, paper 003 §4.2 Alg. 2; xclp.fedavg, xclp.nn).

    Each round samples ⌈fraction · parties⌉ parties from `seed` (public: every party checks the
    draw), trains `local_epochs` of SGD on each and adds n_j·(θ_j − θ) under double masking.
    pseudo_label picks what the unlabeled rows are trained on: "none", "local_lp", "network" or
    "xclp" (one secure XCLP run among the round's parties on the embeddings, DESIGN §5), from
    round `warmup_rounds` on. lsh_bits, k, alpha, power, key_bits and insecure_test_keys are the
    XCLP (and local LP) parameters of the xclp job type.
    """

    n_classes: int = _p("number of classes; labels are 0 .. n_classes − 1 (set by `classes` when that is given)", ">= 2")
    hidden: tuple[int, ...] = _p("widths of the hidden ReLU layers; the last one is the embedding f_φ",
                                 "1 to 8 layers of 1 .. 4096", "xclp.nn", default=(64,))
    rounds: int = _p("training rounds", "1 .. 100000", default=20)
    fraction: float = _p("fraction of the parties sampled each round (at least one)", "(0, 1]", default=1.0)
    local_epochs: int = _p("epochs of local SGD per round (ClientUpdate; the paper: 5)", ">= 1", default=5)
    batch_size: int = _p("rows per SGD step", ">= 1", default=32)
    learning_rate: float = _p("SGD step size η", "> 0", default=0.1)
    momentum: float = _p("SGD momentum μ (0: plain SGD); it restarts every round", "[0, 1)", default=0.0)
    frac_bits: int = _p("fractional bits of the update's fixed-point ring (2^-frac_bits resolution)",
                        "8 .. 40", default=24)
    pseudo_label: str = _p('what unlabeled rows train on: "none" (left out), "local_lp" (each party\'s own label '
                           'propagation), "network" (the model\'s predictions), "xclp" (secure XCLP among the '
                           'round\'s parties); weight = confidence ω', '"none", "local_lp", "network", "xclp"',
                           "paper 003 Alg. 2", default="none")
    warmup_rounds: int = _p("rounds on labeled rows only before pseudo-labelling starts", ">= 0", default=0)
    seed: int = _p("public seed of the initial model and of each round's sample of parties", ">= 0", default=0)
    lsh_bits: int = _p("XCLP: L, LSH bits per embedded row", "multiple of 64", default=1024)
    k: int = _p("XCLP and local LP: neighbours per row", ">= 1", default=10)
    alpha: float = _p("XCLP and local LP: propagation weight α", "(0, 1)", default=0.99)
    power: float = _p("XCLP and local LP: similarity exponent", "> 0", default=3.0)
    key_bits: int = _p("XCLP: Paillier modulus size (each party's key serves every round)",
                       ">= 2048 (smaller with insecure_test_keys)", default=MIN_SECURE_BITS)
    insecure_test_keys: bool = _p("XCLP: allow key_bits below 2048 (tests only)", "true, false", default=False)

    def __post_init__(self) -> None:
        _check_training(self)
        if self.pseudo_label not in PSEUDO_LABELS:
            raise ConfigError(f"pseudo_label must be one of {', '.join(repr(v) for v in PSEUDO_LABELS)}, "
                              f"got {self.pseudo_label!r}")
        _method(lambda: self.optimiser)
        if self.pseudo_label == "xclp":
            _method(lambda: self.xclp_params())

    @property
    def optimiser(self) -> SGD:
        return SGD(self.learning_rate, self.momentum, self.batch_size, self.local_epochs)

    @property
    def graph_params(self) -> GraphParams:
        return GraphParams(self.k, self.alpha, self.power)

    def architecture(self, dim: int) -> Architecture:
        return _method(lambda: Architecture((dim, *self.hidden, self.n_classes)))

    def xclp_params(self) -> XclpJobParams:
        """The parameters of each round's XCLP run (on embeddings, already prepared)."""
        return XclpJobParams(n_classes=self.n_classes, lsh_bits=self.lsh_bits, k=self.k, alpha=self.alpha,
                             power=self.power, key_bits=self.key_bits, insecure_test_keys=self.insecure_test_keys)

    def pseudo_labels_in(self, round: int) -> str:
        """The pseudo-labelling of round t: "none" during the warm-up."""
        return "none" if round < self.warmup_rounds else self.pseudo_label

    @classmethod
    def parse(cls, params: Mapping[str, Any]) -> FedavgJobParams:
        allowed = {"n_classes", "hidden", "rounds", "fraction", "local_epochs", "batch_size", "learning_rate",
                   "momentum", "frac_bits", "pseudo_label", "warmup_rounds", "seed", "lsh_bits", "k", "alpha",
                   "power", "key_bits", "insecure_test_keys"} | DATA_KEYS
        _no_extra(params, allowed, "fedavg")
        hidden = _int_list(params, "hidden", [64], "layer widths")
        return cls(
            n_classes=_n_classes(params), hidden=tuple(hidden), rounds=_int(params, "rounds", 20),
            fraction=_float(params, "fraction", 1.0) or 0.0, local_epochs=_int(params, "local_epochs", 5),
            batch_size=_int(params, "batch_size", 32), learning_rate=_float(params, "learning_rate", 0.1) or 0.0,
            momentum=_float(params, "momentum", 0.0) or 0.0, frac_bits=_int(params, "frac_bits", 24),
            pseudo_label=str(params.get("pseudo_label", "none")),
            warmup_rounds=_int(params, "warmup_rounds", 0, low=0), seed=_int(params, "seed", 0, low=0),
            lsh_bits=_int(params, "lsh_bits", 1024, low=64), k=_int(params, "k", 10),
            alpha=_float(params, "alpha", 0.99) or 0.0, power=_float(params, "power", 3.0) or 0.0,
            key_bits=_int(params, "key_bits", MIN_SECURE_BITS), insecure_test_keys=_bool(params, "insecure_test_keys"),
            **_data(params),
        )


@dataclass(frozen=True)
class DbclJobParams(DataParams):
    """Double-blind collaborative learning of a small network (DESIGN §7, paper 004 §4.2; xclp.dbcl).

    Each round the coordinator draws a fresh seed, sketches each layer in `sketched_layers` with
    S_t ∈ R^{d×s} (s = ⌈sketch_ratio · d⌉) and releases W̃ = S_tᵀW with the seed; every sampled
    party returns b·∂ℓ/∂W̃ on a batch of its labeled rows (or the sum over `local_steps` batches)
    under double masking, and the coordinator steps W with S_t times the mean. sketch = "none"
    runs plain federated SGD (every layer released as it is), the baseline DBCL is measured against.
    """

    n_classes: int = _p("number of classes; labels are 0 .. n_classes − 1 (set by `classes` when that is given)", ">= 2")
    hidden: tuple[int, ...] = _p("widths of the hidden ReLU layers", "1 to 8 layers of 1 .. 4096", "xclp.nn",
                                 default=(64,))
    rounds: int = _p("training rounds (one coordinator step each)", "1 .. 100000", default=200)
    fraction: float = _p("fraction of the parties sampled each round (a public draw from `seed`)", "(0, 1]",
                         default=1.0)
    batch_size: int = _p("labeled rows per party per local step", ">= 1", default=32)
    local_steps: int = _p("local steps E per round; between them a party moves its sketched copy as the "
                          "coordinator would move W", ">= 1", default=1)
    optimiser: str = _p("the coordinator's step: \"sgd\" (with `momentum`) or \"rmsprop\" (the paper's Fig. 2)",
                        '"sgd", "rmsprop"', default="sgd")
    learning_rate: float = _p("step size η of the coordinator (and of local steps)", "> 0", default=0.1)
    momentum: float = _p("SGD momentum μ, kept by the coordinator across rounds", "[0, 1)", default=0.0)
    rmsprop_decay: float = _p("RMSProp decay ρ of the mean squared gradient", "(0, 1)", default=0.9)
    sketch: str = _p('the sketch S_t: "countsketch" (one ±1 per row), "uniform" (sampling: dropout, which the '
                     'paper shows does not stop the probe) or "none" (unsketched federated SGD)',
                     '"countsketch", "uniform", "none"', "paper 004 §2, §4.4", default="countsketch")
    sketch_ratio: float = _p("s/d: each sketched layer with d inputs is released as s = ⌈ratio · d⌉ rows",
                             "(0, 1]", default=0.5)
    sketched_layers: tuple[int, ...] | None = _p("which layers are sketched, 0 = the input layer; unset: every "
                                                 "layer but the output layer (as the paper)",
                                                 "layer numbers", default=None)
    frac_bits: int = _p("fractional bits of the gradient's fixed-point ring (2^-frac_bits resolution)",
                        "8 .. 40", default=24)
    seed: int = _p("public seed of the initial model and of each round's sample of parties", ">= 0", default=0)
    withhold_model: bool = _p("keep the final W from the parties too (the paper's parties never see W); the "
                              "coordinator writes it to the job's `model` file", "true, false", default=False)

    def __post_init__(self) -> None:
        _check_training(self)
        if self.sketch not in (*SKETCH_KINDS, "none"):
            raise ConfigError(f"sketch must be one of countsketch, uniform, none, got {self.sketch!r}")
        if self.optimiser not in OPTIMISERS:
            raise ConfigError(f"optimiser must be one of {', '.join(OPTIMISERS)}, got {self.optimiser!r}")
        _method(lambda: self.server_optimiser())
        layers = self.layers
        if len(set(layers)) != len(layers) or any(not 0 <= i <= len(self.hidden) for i in layers):
            raise ConfigError(f"sketched_layers must name distinct layers in 0..{len(self.hidden)} (the network has "
                              f"{len(self.hidden) + 1}), got {list(layers)}")
        _method(lambda: sketch_sizes(Architecture((1, *self.hidden, self.n_classes)), layers, self.sketch_ratio))

    @property
    def layers(self) -> tuple[int, ...]:
        """The sketched layers (none when sketch = "none")."""
        if self.sketch == "none":
            return ()
        return tuple(range(len(self.hidden))) if self.sketched_layers is None else tuple(self.sketched_layers)

    def architecture(self, dim: int) -> Architecture:
        return _method(lambda: Architecture((dim, *self.hidden, self.n_classes)))

    def sizes(self, dim: int) -> dict[int, int]:
        """s_ℓ of each sketched layer once the data dimension is known."""
        return sketch_sizes(self.architecture(dim), self.layers, self.sketch_ratio)

    def server_optimiser(self) -> ServerOptimiser:
        """A fresh coordinator optimiser (its state lives for the whole job)."""
        return ServerOptimiser(self.optimiser, self.learning_rate, self.momentum, self.rmsprop_decay)

    @classmethod
    def parse(cls, params: Mapping[str, Any]) -> DbclJobParams:
        allowed = {"n_classes", "hidden", "rounds", "fraction", "batch_size", "local_steps", "optimiser",
                   "learning_rate", "momentum", "rmsprop_decay", "sketch", "sketch_ratio", "sketched_layers",
                   "frac_bits", "seed", "withhold_model"} | DATA_KEYS
        _no_extra(params, allowed, "dbcl")
        hidden = _int_list(params, "hidden", [64], "layer widths")
        layers = params.get("sketched_layers")
        return cls(
            n_classes=_n_classes(params), hidden=tuple(hidden), rounds=_int(params, "rounds", 200),
            fraction=_float(params, "fraction", 1.0) or 0.0, batch_size=_int(params, "batch_size", 32),
            local_steps=_int(params, "local_steps", 1), optimiser=str(params.get("optimiser", "sgd")),
            learning_rate=_float(params, "learning_rate", 0.1) or 0.0, momentum=_float(params, "momentum", 0.0) or 0.0,
            rmsprop_decay=_float(params, "rmsprop_decay", 0.9) or 0.0, sketch=str(params.get("sketch", "countsketch")),
            sketch_ratio=_float(params, "sketch_ratio", 0.5) or 0.0,
            sketched_layers=None if layers is None else tuple(_int_list(params, "sketched_layers", [], "layer numbers")),
            frac_bits=_int(params, "frac_bits", 24), seed=_int(params, "seed", 0, low=0),
            withhold_model=_bool(params, "withhold_model"), **_data(params),
        )


def _check_training(p: FedavgJobParams | DbclJobParams) -> None:
    """What the fedavg and dbcl schemas share: classes, data preparation, the network, the rounds."""
    if p.n_classes < 2:
        raise ConfigError("n_classes must be >= 2")
    p._check_data(p.n_classes)
    if not 1 <= len(p.hidden) <= 8 or any(isinstance(h, bool) or not isinstance(h, int) or not 1 <= h <= 4096
                                          for h in p.hidden):
        raise ConfigError(f"hidden must be a list of 1 to 8 layer widths in 1..4096, got {list(p.hidden)}")
    if not 1 <= p.rounds <= 100_000:
        raise ConfigError(f"rounds must be in 1..100000, got {p.rounds}")
    if not 0.0 < p.fraction <= 1.0:
        raise ConfigError(f"fraction must be in (0, 1], got {p.fraction}")
    if not 8 <= p.frac_bits <= 40:
        raise ConfigError(f"frac_bits must be in [8, 40], got {p.frac_bits}")


def _int_list(params: Mapping[str, Any], key: str, default: list[int], what: str) -> list[int]:
    value = params.get(key, default)
    if not isinstance(value, (list, tuple)) or not all(isinstance(h, int) and not isinstance(h, bool) for h in value):
        raise ConfigError(f"job parameter {key!r} must be a list of {what}, got {value!r}")
    return list(value)


def _method(build: Any) -> Any:
    """Build a method's parameter object; its InvalidInput becomes a ConfigError (a job file is wrong)."""
    try:
        return build()
    except ConfigError:
        raise
    except InvalidInput as exc:
        raise ConfigError(str(exc)) from None


JobParams = FlynnJobParams | RaceJobParams | XclpJobParams | FedavgJobParams | DbclJobParams


def uses_paillier(params: JobParams) -> bool:
    """Whether the job runs XCLP, so every party publishes a Paillier key in its bundle (DESIGN §4.1)."""
    return isinstance(params, XclpJobParams) or (isinstance(params, FedavgJobParams) and params.pseudo_label == "xclp")


def parse_params(job_type: str, params: Mapping[str, Any]) -> JobParams:
    if job_type == "flynn":
        return FlynnJobParams.parse(params)
    if job_type == "race":
        return RaceJobParams.parse(params)
    if job_type == "xclp":
        return XclpJobParams.parse(params)
    if job_type == "fedavg":
        return FedavgJobParams.parse(params)
    if job_type == "dbcl":
        return DbclJobParams.parse(params)
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


SCHEMAS: dict[str, type[JobParams]] = {
    "xclp": XclpJobParams, "flynn": FlynnJobParams, "race": RaceJobParams, "fedavg": FedavgJobParams,
    "dbcl": DbclJobParams}
TITLES = {
    "xclp": "cross-client label propagation: every party gets labels for its unlabeled rows (paper 003 Alg. 1, DESIGN §5)",
    "flynn": "a federated FlyNN classifier, equal to the one trained on the pooled data (paper 001, DESIGN §6)",
    "race": "federated RACE sketches for kernel density or class estimates (paper 002, DESIGN §6)",
    "fedavg": "a small network trained by secure federated averaging, optionally on pseudo-labels from XCLP "
              "(paper 003 Alg. 2, DESIGN §7)",
    "dbcl": "a small network trained by double-blind collaborative learning: parties see only sketched "
            "parameters, the coordinator only the sum of sketched gradients (paper 004, DESIGN §7)",
}


def parameter_reference() -> str:
    """The README's job parameter tables, made from the schemas (so the two cannot drift)."""
    out = ["**Every job type**: how each party prepares its table first (DESIGN §8, README \"Your data\").\n"]
    out += _table(fields(DataParams))
    for job_type, schema in SCHEMAS.items():
        out.append(f"**`type = \"{job_type}\"`**: {TITLES[job_type]}.\n")
        out += _table([f for f in fields(schema) if f.name not in DATA_KEYS])
    return "\n".join(out)


def _table(schema_fields: Any) -> list[str]:
    out = ["| parameter | default | range | meaning |", "|---|---|---|---|"]
    for f in schema_fields:
        if f.default is MISSING:
            default = "required"
        elif f.default is None:
            default = "unset"
        else:
            default = f"`{json.dumps(f.default)}`"
        see = f" ({f.metadata['see']})" if f.metadata["see"] else ""
        out.append(f"| `{f.name}` | {default} | {f.metadata['range']} | {f.metadata['meaning']}{see} |")
    out.append("")
    return out
