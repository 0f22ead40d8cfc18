"""Does federating help? Held-out labeled rows and the comparison on them, shared by
`xclp-client simulate` (xclp.simulation.compare: alone, federated and pooled for every party
before any institution is involved) and `xclp-client run --validate` (client/validate.py: alone
and federated for the party itself, in a real run).

Held-out rows are a fraction of a party's labeled rows, drawn from a public seed named by the
party and the purpose, so a rerun holds out the same rows; their labels are hidden from every
computation and only compared with at the end.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from xclp.errors import ConfigError, InvalidInput
from xclp.seeding import public_rng

__all__ = ["Comparison", "accuracy", "check_fraction", "hold_out", "table", "wilson"]


Z95 = 1.959963984540054  # the normal quantile of a two-sided 95 % interval


@dataclass(frozen=True)
class Comparison:
    """One party's accuracies on its `held_out` rows (`pooled`: None in a real run, where no one has
    it; `baseline`: a logistic regression on the party's own labeled rows, xclp.baselines)."""

    party: str
    held_out: int
    alone: float
    federated: float
    pooled: float | None = None
    baseline: float | None = None

    @property
    def helps(self) -> bool:
        """Federating is better than alone, beyond the uncertainty of so few held-out rows."""
        return wilson(self.federated, self.held_out)[0] > wilson(self.alone, self.held_out)[1]

    @property
    def hurts(self) -> bool:
        return wilson(self.federated, self.held_out)[1] < wilson(self.alone, self.held_out)[0]


def wilson(accuracy: float, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of an accuracy measured on n rows (Wilson 1927; Brown, Cai and
    DasGupta 2001 recommend it over the normal approximation for small n)."""
    if n <= 0:
        return 0.0, 1.0
    centre = (accuracy + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * float(np.sqrt(accuracy * (1 - accuracy) / n + z * z / (4 * n * n)))
    return max(0.0, centre - half), min(1.0, centre + half)


def check_fraction(fraction: float, option: str) -> float:
    if not 0.0 < fraction < 1.0:
        raise ConfigError(f"{option} must be a fraction in (0, 1), got {fraction}")
    return fraction


def hold_out(y: np.ndarray, fraction: float, party: str, seed_name: str) -> np.ndarray:
    """int64[h], sorted: `fraction` of the labeled rows of y (−1 = unlabeled), at least one, and
    at least one labeled row left to learn from."""
    labeled = np.flatnonzero(y >= 0)
    if labeled.size < 2:
        raise InvalidInput(f"party {party!r} has {labeled.size} labeled rows: nothing to hold out and still learn from")
    count = min(labeled.size - 1, max(1, round(fraction * labeled.size)))
    return np.sort(public_rng(labeled.size, f"{seed_name}/{party}").choice(labeled, count, replace=False))


def accuracy(predicted: np.ndarray, truth: np.ndarray) -> float:
    return float(np.mean(np.asarray(predicted) == truth))


def _cell(value: float, n: int) -> str:
    low, high = wilson(value, n)
    return f"{value:.3f} [{low:.2f}, {high:.2f}]"


def table(rows: list[Comparison]) -> str:
    """The comparison as the CLI prints it: each accuracy with its 95 % interval, and a verdict per
    party only where the intervals say one."""
    pooled = all(r.pooled is not None for r in rows)
    baseline = all(r.baseline is not None for r in rows)
    width = 20
    head = f"{'party':<16}{'held out':>9}  {'alone (LP)':<{width}}{'federated':<{width}}"
    head += (f"{'logistic (own)':<{width}}" if baseline else "") + (f"{'pooled':<{width}}" if pooled else "")
    lines = [head.rstrip()]
    for r in rows:
        n = r.held_out
        line = f"{r.party:<16}{n:>9}  {_cell(r.alone, n):<{width}}{_cell(r.federated, n):<{width}}"
        if baseline and r.baseline is not None:
            line += f"{_cell(r.baseline, n):<{width}}"
        if pooled and r.pooled is not None:
            line += f"{_cell(r.pooled, n):<{width}}"
        lines.append(line.rstrip())
    lines.append("(accuracy on each party's held-out labeled rows, with its 95 % Wilson interval; alone: label "
                 "propagation on the party's rows" + ("; logistic: a logistic regression on its own labeled rows"
                                                      if baseline else "")
                 + ("; pooled: one central table, for reference)" if pooled else ")"))
    for r in rows:
        if r.hurts:
            lines.append(f"WARNING: for {r.party}, federating is worse than its own rows alone ({r.federated:.3f} "
                         f"against {r.alone:.3f} on {r.held_out} held-out rows): check that every party's labels "
                         "mean the same and that the columns carry the class (an unhelpful column can be dropped)")
        elif r.federated == r.alone:
            if r.alone < 1.0:
                lines.append(f"note: for {r.party}, federating does not change its accuracy ({r.alone:.3f} on "
                             f"{r.held_out} held-out rows)")
        elif not r.helps:
            lines.append(f"note: for {r.party}, {r.held_out} held-out rows are too few to tell federated from alone "
                         f"({r.federated:.3f} against {r.alone:.3f}: the intervals overlap); hold out more rows, or "
                         "compare on more data")
        if r.baseline is not None and wilson(r.baseline, r.held_out)[0] > wilson(r.federated, r.held_out)[1]:
            lines.append(f"note: for {r.party}, a logistic regression on its own labeled rows does better than "
                         f"federated label propagation ({r.baseline:.3f} against {r.federated:.3f}): on this table a "
                         "plain local model may serve it better")
    return "\n".join(lines)
