"""What every job's parameters are made of, as they travel in `JobSpec.params_json`.

`JobParams` is the base of every job type's schema (xclp.v1.registry lists them): the data
preparation every job may ask for (docs/design.md §8) and the questions both ends ask of any job without
knowing its type — does it publish Paillier keys, does it need labeled rows, what DP does it
promise. A schema answers them by overriding a property; nothing outside the registry asks
"which job type is this".

The helpers below (`param`, `int_param`, ...) build and parse schema fields; each field carries
the text of the parameter reference (docs/job-parameters.md), so the two cannot drift. The coordinator validates
a job's parameters when it loads the job file; every party validates them again when it receives
the spec. Each schema builds the method's own parameter object, so a value the method would
refuse is refused when the job file is loaded, not after the parties joined.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, field
from functools import lru_cache
from typing import Any, TypeVar

import numpy as np

from xclp.errors import ConfigError, InvalidInput
from xclp.privacy.dp_moments import MomentsPlan, bounds_array
from xclp.privacy.dp_moments import plan as plan_moments

IMPUTE = ("none", "mean")
# the parameters every job type has (JobParams' own fields)
DATA_KEYS = frozenset({"classes", "standardise", "impute", "categorical", "share_threshold", "moments_epsilon",
                       "moments_delta", "moments_bounds", "columns", "id_column"})
MAX_CLASSES = 4096
MAX_DP_DELTA = 0.01  # δ is the chance a DP guarantee fails outright; docs/privacy.md: take 1/n² for n rows
# Parameters that were renamed: a job file naming the old one hears the new name.
RENAMED = {"n_bits": "lsh_bits"}

_REQUIRED: Any = MISSING
T = TypeVar("T")


def param(meaning: str, range_: str, see: str = "", *, default: Any = _REQUIRED, kw_only: bool = False) -> Any:
    """A schema field with the text of the parameter reference (docs/job-parameters.md)."""
    return field(default=default, kw_only=kw_only, metadata={"meaning": meaning, "range": range_, "see": see})


@dataclass(frozen=True)
class KeySpec:
    """The Paillier keys a job needs from every party (docs/design.md §4.1): their size, whether sizes
    below 2048 bits are allowed (tests only), and why the job needs them (for error messages)."""

    bits: int
    insecure_test_keys: bool
    why: str


@dataclass(frozen=True)
class JobParams:
    """The parameters every job has: how each party prepares its table before the job's first
    step (docs/design.md §8), and what both ends need to know of any job type.

    classes: label cells hold these names, numbered by their order here on every party.
    standardise / impute: one masked sum of (n, Σx, Σx²) per feature (the "moments" phase, docs/design.md
    §6.1); every party scales with the pooled mean and standard deviation and/or fills missing
    cells with the pooled mean; features constant everywhere are dropped by every party alike.
    """

    classes: tuple[str, ...] | None = param("class names, in the order that numbers them; label cells then hold "
                                            "these names (unset: label cells are class numbers)",
                                            "distinct, non-empty", "docs/data.md", default=None, kw_only=True)
    standardise: bool = param("scale every feature by the pooled mean and standard deviation of all parties "
                              "(the coordinator learns those, nothing per party)", "true, false",
                              "docs/protocol.md#preparation", default=False, kw_only=True)
    impute: str = param('"mean": fill empty or NaN feature cells with the pooled mean; "none": refuse them',
                        '"none", "mean"', "docs/protocol.md#preparation", default="none", kw_only=True)
    categorical: dict[str, tuple[str, ...]] | None = param(
        "text columns as a table `[params.categorical]` of column = [categories]: each becomes one 0/1 "
        "column per category, in the declared order, on every party (CSV and Parquet)",
        "distinct, non-empty", "docs/data.md", default=None, kw_only=True)
    columns: tuple[str, ...] | None = param(
        "the job's schema: the feature columns of every party's table, in order, as its file names them (a "
        "categorical column by its own name); each party checks its table against it before joining, and the "
        "coordinator each party's (unset: the first party to join sets them)", "distinct, non-empty",
        "docs/data.md", default=None, kw_only=True)
    id_column: str | None = param(
        "the column of every party's table that holds its row ids (not a feature): each party checks that it "
        "reads its ids from it (a party still names its id column itself, --id-column: a job never changes how a "
        "party reads its table); `xclp-client simulate` reads the tables by it (unset: not checked)",
        "a column name, not in columns", "docs/data.md", default=None, kw_only=True)
    share_threshold: int = param(
        "t of the t-of-n Shamir shares of every self-mask seed: a party lost while revealing is recovered from "
        "t of the others' shares (0: a majority of each attempt's parties, ⌊n/2⌋ + 1)",
        "0, or 2 .. the expected parties", "docs/threat-model.md", default=0, kw_only=True)
    moments_epsilon: float | None = param(
        "record-level DP for the pooled moments of standardise / impute: the ε of that one release (off when "
        "unset; needs moments_delta and moments_bounds)", "> 0", "docs/privacy.md", default=None,
        kw_only=True)
    moments_delta: float | None = param("the δ of moments_epsilon (take 1/n² for n rows)", "(0, 0.01]",
                                        "docs/privacy.md", default=None, kw_only=True)
    moments_bounds: tuple[tuple[float, float], ...] | None = param(
        "with moments_epsilon: the public range every feature's values are clipped to for the moments, as "
        "[lo, hi] for all features or [[lo, hi], ...] one per feature column", "lo < hi, finite",
        "docs/privacy.md", default=None, kw_only=True)

    # --- what both ends ask of any job ----------------------------------------------------------

    @property
    def feature_columns(self) -> tuple[str, ...] | None:
        """The job's schema as a party's matrix has it: `columns`, a categorical one as one column
        per category ("colour=red"), as xclp.data.tables reads it; None without a schema."""
        if self.columns is None:
            return None
        cats = self.categorical or {}
        return tuple(n for c in self.columns for n in ([f"{c}={v}" for v in cats[c]] if c in cats else [c]))

    @classmethod
    def parse(cls: type[T], raw: Mapping[str, Any]) -> T:
        """The schema from a job file's [params] table (or the spec's JSON); ConfigError if wrong."""
        raise NotImplementedError

    @property
    def prepares(self) -> bool:
        """Whether the job runs the "moments" phase before its first step (docs/design.md §8)."""
        return self.standardise or self.impute == "mean"

    @property
    def label_classes(self) -> int:
        """How many classes a party's labels may name (0: labels are not used)."""
        return 0

    @property
    def needs_labels(self) -> bool:
        """Whether the job is refused when no party brings a labeled row."""
        return False

    @property
    def paillier(self) -> KeySpec | None:
        """The Paillier keys every party publishes in its bundle, or None (docs/design.md §4.1)."""
        return None

    @property
    def release_epsilon(self) -> float | None:
        """The ε of everything the job type's own releases say about a row, over all of them (a
        training job: all its rounds); None if they are not DP."""
        return None

    @property
    def release_delta(self) -> float:
        """The δ of `release_epsilon` (0: the job type's releases are pure ε-DP)."""
        return 0.0

    @property
    def dp_releases(self) -> tuple[tuple[str, float, float], ...]:
        """What the job's DP releases spend of a data set's privacy budget (client/ledger.py):
        (kind, ε, δ) per kind of release: "moments", "release" (the job type's own), and XCLP's
        "labels" or "responses" (randomised responses, reused by every later run)."""
        out: list[tuple[str, float, float]] = []
        if self.moments_dp:
            assert self.moments_epsilon is not None and self.moments_delta is not None
            out.append(("moments", self.moments_epsilon, self.moments_delta))
        if self.release_epsilon is not None:
            out.append(("release", self.release_epsilon, self.release_delta))
        return tuple(out)

    @property
    def moments_dp(self) -> bool:
        """Whether the moments phase releases with DP (xclp.privacy.dp_moments)."""
        return self.prepares and self.moments_epsilon is not None

    @property
    def epsilon_total(self) -> float | None:
        """The ε of everything the job releases about a row: its own releases' plus, if it
        standardises or imputes, the moments' (basic composition); None if anything it releases
        is not DP. A party's --require-dp compares it."""
        own = self.release_epsilon
        if own is None or not self.prepares:
            return own
        return own + self.moments_epsilon if self.moments_epsilon is not None else None

    @property
    def label_epsilon_total(self) -> float | None:
        """The ε of everything the job releases about one label (a party's --require-label-dp
        compares it): a job that reads no labels spends none; record-level DP covers labels too
        (the moments read no labels)."""
        return self.release_epsilon if self.label_classes else 0.0

    def moments_plan(self, dim: int) -> MomentsPlan | None:
        """The noise of the DP moments for a table of `dim` feature columns (None without them)."""
        if not self.moments_dp:
            return None
        assert self.moments_epsilon is not None and self.moments_delta is not None
        return _moments_plan(self.moments_epsilon, self.moments_delta, dim, self.impute == "mean")

    def moments_ranges(self, dim: int) -> np.ndarray:
        """float64[dim, 2]: the moments' clipping bounds per feature (InvalidInput if they do not fit)."""
        if self.moments_bounds is None:
            raise InvalidInput("the job sets no moments_bounds")
        return bounds_array(self.moments_bounds, dim)

    def check_table(self, dim: int) -> None:
        """Refuse (InvalidInput) a table of `dim` feature columns, as read, before any work on it:
        what the moments need of it, then `check_dim`."""
        if self.moments_dp:
            self.moments_ranges(dim)
            self.moments_plan(dim)
        self.check_dim(dim)

    @property
    def hides_labeled_rows(self) -> bool:
        """Whether the coordinator must not learn which (or how many) rows are labeled."""
        return False

    @property
    def unsketched_layers(self) -> tuple[int, ...]:
        """DBCL: the network's layers whose gradients the job releases unsketched (a party refuses any
        unless --allow-unsketched-layers); no other job sketches."""
        return ()

    @property
    def differenced_without_dp(self) -> str:
        """Why the job's releases can be differenced across rounds into one party's data when it
        runs without DP ("" if they cannot, or carry DP): a party refuses such a job unless it
        opts in (DBCL: --allow-non-dp-dbcl)."""
        return ""

    @property
    def required_files(self) -> dict[str, str]:
        """Job-file keys naming files the coordinator must write with these parameters, and why."""
        return {}

    def for_rows(self, rows: int) -> JobParams:
        """The parameters a run among parties of `rows` rows in all (the roster's) runs with: these,
        unless a parameter's default depends on the size (XCLP's pair_budget)."""
        return self

    def resolved(self) -> dict[str, Any]:
        """What `for_rows` made concrete, as a run's state keeps it: a restarted side reads these back
        (`with_resolved`) and never resolves them again. None here."""
        return {}

    def with_resolved(self, values: Mapping[str, Any]) -> JobParams:
        """These parameters with the concrete values a run's state kept (`resolved`); InvalidInput if
        they are not what these parameters resolve (a state of another job)."""
        if values:
            raise InvalidInput(f"a saved state resolves {', '.join(sorted(values))}, which this job does not have")
        return self

    def check_dim(self, dim: int) -> None:
        """Refuse (InvalidInput) data of `dim` feature columns, before any work on it."""

    def check_rows(self, most: int) -> None:
        """Refuse (ConfigError) parameters whose sums could overflow their ring when the parties
        bring up to `most` rows in all (the job's row caps)."""

    def check_roster(self, expected: int, min_parties: int) -> None:
        """Refuse (ConfigError) parameters that cannot run among `expected` parties, `min_parties` of them."""

    def check_threshold(self, expected: int) -> None:
        """Refuse (ConfigError) a share threshold outside 0 (a majority) or 2 .. `expected`."""
        t = self.share_threshold
        if t and not 2 <= t <= expected:
            raise ConfigError(f"share_threshold must be 0 (a majority) or between 2 and the {expected} expected "
                              f"parties, got {t}")

    # --- checks every schema shares -------------------------------------------------------------

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
        if self.columns is not None:
            if not self.columns or any(not c for c in self.columns) or len(set(self.columns)) != len(self.columns):
                raise ConfigError(f"columns must list distinct, non-empty column names, got {list(self.columns)}")
            unknown = sorted(set(self.categorical or {}) - set(self.columns))
            if unknown:
                raise ConfigError(f"categorical names {', '.join(unknown)}, which columns does not list")
        for column, categories in (self.categorical or {}).items():
            if (not column or not categories or any(not c for c in categories)
                    or len(set(categories)) != len(categories)):
                raise ConfigError(f"categorical column {column!r} needs a list of distinct, non-empty categories")
        if self.impute not in IMPUTE:
            raise ConfigError(f"impute must be one of {', '.join(repr(v) for v in IMPUTE)}, got {self.impute!r}")
        self._check_moments()

    def _check_moments(self) -> None:
        eps, delta, bounds = self.moments_epsilon, self.moments_delta, self.moments_bounds
        if eps is None:
            if delta is not None or bounds is not None:
                raise ConfigError("moments_delta and moments_bounds are for moments_epsilon, which is not set")
            return
        if not self.prepares:
            raise ConfigError("moments_epsilon is set but the job neither standardises nor imputes: it releases no "
                              "moments")
        if not eps > 0:
            raise ConfigError(f"moments_epsilon must be > 0, got {eps}")
        if delta is None or bounds is None:
            raise ConfigError("moments_epsilon needs moments_delta (take 1/n² for n rows) and moments_bounds (the "
                              "public range of every feature's values)")
        if not 0 < delta <= MAX_DP_DELTA:
            raise ConfigError(f"moments_delta must be in (0, {MAX_DP_DELTA}] (the chance the guarantee fails; take "
                              f"1/n² for n rows), got {delta}")
        if not bounds:
            raise ConfigError("moments_bounds must give at least one [lo, hi] range")
        method(lambda: bounds_array(bounds, len(bounds)))
        method(lambda: _moments_plan(eps, delta, len(bounds) if len(bounds) > 1 else 1, self.impute == "mean"))


# --- parsing a [params] table ---------------------------------------------------------------------


def check_names(raw: Mapping[str, Any], allowed: frozenset[str], job_type: str) -> None:
    """Refuse parameter names the schema does not know, naming the renamed ones' new names."""
    allowed = allowed | DATA_KEYS
    for old, new in RENAMED.items():
        if old in raw and new in allowed:
            raise ConfigError(f"{job_type} job parameter {old!r} is now called {new!r} (the number of LSH bits L)")
    extra = sorted(set(raw) - allowed)
    if extra:
        raise ConfigError(f"unknown {job_type} job parameter(s): {', '.join(extra)}; "
                          f"allowed: {', '.join(sorted(allowed))}")


def int_param(raw: Mapping[str, Any], key: str, default: int | None = None, *, low: int = 1) -> int:
    value = raw.get(key, default)
    if value is None:
        raise ConfigError(f"job parameter {key!r} is required")
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ConfigError(f"job parameter {key!r} must be an integer >= {low}, got {value!r}")
    return value


def optional_float(raw: Mapping[str, Any], key: str) -> float | None:
    value = raw.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"job parameter {key!r} must be a finite number, got {value!r}")
    return float(value)


def float_param(raw: Mapping[str, Any], key: str, default: float) -> float:
    value = optional_float(raw, key)
    return default if value is None else value


def bool_param(raw: Mapping[str, Any], key: str) -> bool:
    value = raw.get(key, False)
    if not isinstance(value, bool):
        raise ConfigError(f"job parameter {key!r} must be true or false, got {value!r}")
    return value


def str_param(raw: Mapping[str, Any], key: str, default: str) -> str:
    value = raw.get(key, default)
    if not isinstance(value, str):
        raise ConfigError(f"job parameter {key!r} must be a string, got {value!r}")
    return value


def int_list(raw: Mapping[str, Any], key: str, default: list[int], what: str) -> list[int]:
    value = raw.get(key, default)
    if not isinstance(value, (list, tuple)) or not all(isinstance(h, int) and not isinstance(h, bool) for h in value):
        raise ConfigError(f"job parameter {key!r} must be a list of {what}, got {value!r}")
    return list(value)


def n_classes_param(raw: Mapping[str, Any], default: int | None = None, *, low: int = 2) -> int:
    """n_classes, which `classes` (a list of names) sets when it is given."""
    classes = raw.get("classes")
    if isinstance(classes, (list, tuple)):
        default = len(classes)
    return int_param(raw, "n_classes", default, low=low)


def data_params(raw: Mapping[str, Any]) -> dict[str, Any]:
    """The keyword arguments of `JobParams`' own fields from a [params] table."""
    classes = raw.get("classes")
    if classes is not None:
        if not isinstance(classes, (list, tuple)) or not all(isinstance(c, str) for c in classes):
            raise ConfigError(f"job parameter 'classes' must be a list of names, got {classes!r}")
        classes = tuple(c.strip() for c in classes)
    impute = raw.get("impute", "none")
    if not isinstance(impute, str):
        raise ConfigError(f"job parameter 'impute' must be \"none\" or \"mean\", got {impute!r}")
    categorical = raw.get("categorical")
    if categorical is not None:
        if not isinstance(categorical, Mapping) or not all(
                isinstance(v, (list, tuple)) and all(isinstance(c, str) for c in v) for v in categorical.values()):
            raise ConfigError("job parameter 'categorical' must be a table of column = [category names]")
        categorical = {str(k): tuple(c.strip() for c in v) for k, v in categorical.items()}
    columns = raw.get("columns")
    if columns is not None:
        if not isinstance(columns, (list, tuple)) or not all(isinstance(c, str) for c in columns):
            raise ConfigError(f"job parameter 'columns' must be a list of column names, got {columns!r}")
        columns = tuple(c.strip() for c in columns)
    id_column = raw.get("id_column")
    if id_column is not None:
        if not isinstance(id_column, str) or not id_column.strip():
            raise ConfigError(f"job parameter 'id_column' must be a column name, got {id_column!r}")
        id_column = id_column.strip()
        if columns is not None and id_column in columns:
            raise ConfigError(f"job parameter 'id_column' {id_column!r} is also in 'columns': the id column is not "
                              "a feature")
    return {"classes": classes, "columns": columns, "id_column": id_column,
            "standardise": bool_param(raw, "standardise"), "impute": impute,
            "categorical": categorical, "share_threshold": int_param(raw, "share_threshold", 0, low=0),
            "moments_epsilon": optional_float(raw, "moments_epsilon"),
            "moments_delta": optional_float(raw, "moments_delta"), "moments_bounds": _bounds_param(raw)}


def _bounds_param(raw: Mapping[str, Any]) -> tuple[tuple[float, float], ...] | None:
    """moments_bounds: [lo, hi] for every feature, or [[lo, hi], ...] one per feature column."""
    value = raw.get("moments_bounds")
    if value is None:
        return None

    def number(v: Any) -> bool:
        return not isinstance(v, bool) and isinstance(v, (int, float))

    if isinstance(value, (list, tuple)) and len(value) == 2 and all(number(v) for v in value):
        return ((float(value[0]), float(value[1])),)
    if (isinstance(value, (list, tuple)) and value
            and all(isinstance(p, (list, tuple)) and len(p) == 2 and all(number(v) for v in p) for p in value)):
        return tuple((float(lo), float(hi)) for lo, hi in value)
    raise ConfigError(f"job parameter 'moments_bounds' must be [lo, hi] or a list of [lo, hi], got {value!r}")


@lru_cache(maxsize=64)
def _moments_plan(epsilon: float, delta: float, dim: int, noisy_counts: bool) -> MomentsPlan:
    return plan_moments(epsilon, delta, dim, noisy_counts=noisy_counts)


def method(build: Callable[[], T]) -> T:
    """Build a method's parameter object; its InvalidInput becomes a ConfigError (a job file is wrong)."""
    try:
        return build()
    except ConfigError:
        raise
    except InvalidInput as exc:
        raise ConfigError(str(exc)) from None
