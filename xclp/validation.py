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

__all__ = ["Comparison", "accuracy", "check_fraction", "hold_out", "table"]


@dataclass(frozen=True)
class Comparison:
    """One party's accuracies on its `held_out` rows (`pooled`: None in a real run, where no one has it)."""

    party: str
    held_out: int
    alone: float
    federated: float
    pooled: float | None = None

    @property
    def helps(self) -> bool:
        return self.federated > self.alone


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


def table(rows: list[Comparison]) -> str:
    """The comparison as the CLI prints it, with a warning per party federating does not help."""
    pooled = all(r.pooled is not None for r in rows)
    lines = [f"{'party':<16}{'held out':>9}{'alone':>9}{'federated':>11}" + (f"{'pooled':>9}" if pooled else "")]
    lines += [f"{r.party:<16}{r.held_out:>9}{r.alone:>9.3f}{r.federated:>11.3f}"
              + (f"{r.pooled:>9.3f}" if r.pooled is not None and pooled else "") for r in rows]
    lines.append("(accuracy on each party's held-out labeled rows" + ("; pooled: one central table, for reference)"
                                                                       if pooled else ")"))
    for r in rows:
        if r.federated < r.alone:
            lines.append(f"WARNING: for {r.party}, federating is worse than its own rows alone ({r.federated:.3f} "
                         f"against {r.alone:.3f} on {r.held_out} held-out rows): check that every party's labels "
                         "mean the same and that the columns carry the class (an unhelpful column can be dropped)")
        elif r.federated == r.alone < 1.0:
            lines.append(f"note: for {r.party}, federating does not change its accuracy ({r.alone:.3f} on "
                         f"{r.held_out} held-out rows)")
    return "\n".join(lines)
