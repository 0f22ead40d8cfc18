"""A data set's DP budget and the charges against it (client/ledger.py keeps them per data set;
docs/privacy.md): the budget, one charge (`Spend`), how charges compose (`spent`: basic
composition, or their Rényi-DP curves added and converted, whichever is tighter) and what a job's
DP releases charge (`job_spends`)."""

from __future__ import annotations

import math
import secrets
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from xclp.errors import ConfigError
from xclp.privacy.accounting import ORDERS, composed_epsilon, pure_rdp


@dataclass(frozen=True)
class Budget:
    """The most a data set may spend in all, over every DP release of every run."""

    epsilon: float
    delta: float

    def __post_init__(self) -> None:
        if not (np.isfinite(self.epsilon) and self.epsilon > 0):
            raise ConfigError(f"a privacy budget's epsilon must be > 0, got {self.epsilon!r}")
        if not 0 <= self.delta < 1:
            raise ConfigError(f"a privacy budget's delta must be in [0, 1), got {self.delta!r}")

    @classmethod
    def parse(cls, text: str | float | Sequence[float], given_as: str = "--privacy-budget") -> Budget:
        """"EPS" or "EPS,DELTA" (the flag), a number, or [EPS, DELTA] (TOML); a ConfigError names the
        setting `given_as`, the way the user gave it (the flag, a TOML key, the API's keyword)."""
        wrong = ConfigError(f"{given_as} takes EPS or EPS,DELTA (e.g. 10, \"10,1e-5\" or [10, 1e-5]), got {text!r}")
        if isinstance(text, bool):
            raise wrong
        if isinstance(text, (int, float)):
            return cls.named(float(text), DEFAULT_BUDGET.delta, given_as)
        parts: list[Any] = text.split(",") if isinstance(text, str) else list(text)
        try:
            values = [float(p) for p in parts]
        except (TypeError, ValueError):
            raise wrong from None
        if len(values) not in (1, 2):
            raise wrong
        return cls.named(values[0], values[1] if len(values) == 2 else DEFAULT_BUDGET.delta, given_as)

    @classmethod
    def named(cls, epsilon: float, delta: float, given_as: str) -> Budget:
        try:
            return cls(epsilon, delta)
        except ConfigError as exc:
            raise ConfigError(f"{given_as}: {exc}") from None

    @classmethod
    def of(cls, value: str | float | Sequence[float] | Budget | None, given_as: str) -> Budget:
        """A privacy budget from the API's, the CLI's, a run.toml's or an agent's setting `given_as`
        (None: the default, DEFAULT_BUDGET)."""
        if value is None:
            return DEFAULT_BUDGET
        return value if isinstance(value, Budget) else cls.parse(value, given_as)


# docs/privacy.md says why: ε = 10 over a data set's lifetime keeps the odds any one row changes
# what an observer believes below e^10 in the worst case, and is the order of the largest
# deployed budgets (the 2020 US Census's person file spent ε ≈ 17 on a whole country); δ = 10⁻⁵
# stays below 1/n for tables up to 100 000 rows
DEFAULT_BUDGET = Budget(10.0, 1e-5)


@dataclass(frozen=True)
class Spend:
    """A DP release's guarantee, charged once under `key` (a run's releases, or the randomised
    responses of one ε, which every later run reuses), with its RDP curve where known."""

    epsilon: float
    delta: float
    key: str
    what: str
    kind: str = ""
    rdp: tuple[float, ...] | None = None

    def record(self) -> dict[str, Any]:
        out: dict[str, Any] = {"epsilon": self.epsilon, "delta": self.delta, "what": self.what}
        if self.rdp is not None:
            out["rdp"] = list(self.rdp)
        return out


def curve_of(charge: dict[str, Any]) -> list[float] | None:
    curve = charge.get("rdp")
    return curve if isinstance(curve, list) and len(curve) == len(ORDERS) else None


def spent(charges: Iterable[dict[str, Any]], delta: float) -> tuple[float, float, str]:
    """(ε, δ, how) of a data set's charges within a budget of δ = `delta`: basic composition (ε and δ
    add up), or the charges with an RDP curve composed and converted at what the others leave of
    `delta`, plus the others' ε, whichever gives the smaller ε within `delta`."""
    charges = list(charges)
    eps, total_delta = math.fsum(c["epsilon"] for c in charges), math.fsum(c["delta"] for c in charges)
    curved = [curve for curve in map(curve_of, charges) if curve is not None]
    rest = [c for c in charges if curve_of(c) is None]
    rest_eps, rest_delta = math.fsum(c["epsilon"] for c in rest), math.fsum(c["delta"] for c in rest)
    if not curved or rest_delta >= delta:
        return eps, total_delta, "basic"
    rdp_eps = composed_epsilon(curved, delta - rest_delta) + rest_eps
    if total_delta <= delta and eps <= rdp_eps:
        return eps, total_delta, "basic"
    return rdp_eps, delta, "rdp"


_KINDS = {"moments": "the DP moments", "release": "the job's DP releases", "labels": "label-DP row sums",
          "responses": "randomised responses of the labels"}
RESPONSES_KEY = "responses"  # the one charge of a data set's randomised responses (client/responses.py)


def job_spends(params: Any, dim: int, drawn: dict[str, Any] | None = None) -> tuple[Spend, ...]:
    """The charges of a job's DP releases (JobParams.dp_releases) in one run, for a table of `dim`
    feature columns. Each run's key is drawn by the party (a coordinator that reused a job id, run
    id or nonce would otherwise get a second run charged as the first); randomised responses are
    drawn once per data set and charged once, at the ε they were drawn with (`drawn`: what the
    ledger recorded of the draw, if made). The RDP curves known before Join go with them: a pure
    ε-DP release's, and the DP moments' (their noise depends on the table's width only); a
    training job's and label-DP's are attached once the run has planned their noise
    (RunAccount.mechanism)."""
    run = secrets.token_hex(16)
    out = []
    for kind, epsilon, delta in params.dp_releases:
        if kind == "responses" and drawn is not None:
            epsilon = float(drawn["epsilon"])
        key = RESPONSES_KEY if kind == "responses" else f"run:{run}:{kind}"
        curve = (pure_rdp(epsilon) if delta == 0 else params.moments_plan(dim).rdp if kind == "moments" else None)
        out.append(Spend(epsilon, delta, key, _KINDS[kind], kind, curve))
    return tuple(out)
