"""A run's summary (docs/design.md §9): per-step seconds and bytes, who took part, who dropped and why.

Nothing sensitive goes in: no payloads, keys, labels or distances, only sizes and timings. The
coordinator logs it when a job ends and, if the job file names `summary`, writes it as JSON.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from xclp.privacy.dp_moments import MomentsPlan

if TYPE_CHECKING:
    from xclp.server.run import Run


@dataclass
class StepStats:
    """Per step name, summed over its rounds: wall seconds and bytes in, relayed and sent out."""

    seconds: float = 0.0
    rounds: int = 0
    bytes_in: int = 0
    bytes_relayed: int = 0
    bytes_out: int = 0
    # "c in r3.update": parties lost while revealing whose self-mask seed was rebuilt (never the value)
    recovered: list[str] = field(default_factory=list)

    @property
    def bytes_total(self) -> int:
        return self.bytes_in + self.bytes_relayed + self.bytes_out

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"seconds": round(self.seconds, 6), "rounds": self.rounds, "bytes_in": self.bytes_in,
                               "bytes_relayed": self.bytes_relayed, "bytes_out": self.bytes_out}
        if self.recovered:
            out["recovered"] = list(self.recovered)
        return out


class StepLedger:
    """StepStats by step or message name, in the order they first happened."""

    def __init__(self) -> None:
        self.steps: dict[str, StepStats] = {}

    @classmethod
    def of(cls, saved: dict[str, dict[str, Any]]) -> StepLedger:
        """The ledger `as_dict` wrote (a checkpoint's, server/resume.py)."""
        ledger = cls()
        for name, st in saved.items():
            ledger.steps[name] = StepStats(float(st["seconds"]), int(st["rounds"]), int(st["bytes_in"]),
                                           int(st["bytes_relayed"]), int(st["bytes_out"]),
                                           [str(r) for r in st.get("recovered", [])])
        return ledger

    def __getitem__(self, name: str) -> StepStats:
        return self.steps.setdefault(name, StepStats())

    def record(self, name: str, seconds: float, *, bytes_in: int = 0, bytes_relayed: int = 0) -> None:
        """One round of `name` is over."""
        stats = self[name]
        stats.seconds += seconds
        stats.rounds += 1
        stats.bytes_in += bytes_in
        stats.bytes_relayed += bytes_relayed

    def sent(self, name: str, size: int) -> None:
        self[name].bytes_out += size

    @property
    def bytes_total(self) -> int:
        return sum(s.bytes_total for s in self.steps.values())

    @property
    def recovered(self) -> list[str]:
        """Every "c in r3.update": whose self-mask seed was rebuilt, in which sum."""
        return [r for s in self.steps.values() for r in s.recovered]

    def as_dict(self) -> dict[str, dict[str, Any]]:
        return {name: s.as_dict() for name, s in self.steps.items()}


def log_line(summary: dict[str, Any]) -> str:
    """One line for the coordinator's log: outcome, seconds, bytes and each step's seconds."""
    steps = "; ".join(f"{k} {v['seconds']:.3f}s" for k, v in summary["steps"].items())
    return (f"{summary['outcome']} in {summary['total_seconds']:.3f}s; {summary['bytes_total']} bytes moved; "
            f"{steps}")


def privacy_report(job: dict[str, Any], moments: MomentsPlan | None) -> dict[str, Any]:
    """The run's privacy report: the job's (`job`'s "privacy": its accountant with DP, xclp's
    label-DP) and, once the DP moments are released (`moments`), theirs as "moments"; "line" says
    all of it in one line."""
    privacy = dict(job.get("privacy", {}))
    if moments is not None:
        privacy["moments"] = report = moments.report()
        privacy["line"] = "; ".join(part for part in (privacy.get("line", ""), str(report["line"])) if part)
    return privacy


def run_summary(run: Run, *, privacy_only: bool = False) -> dict[str, Any]:
    """A run's summary (docs/design.md §9): per-step seconds and bytes, who dropped and why, the job's own
    summary and the privacy report; nothing sensitive. `privacy_only`: the privacy report alone."""
    job = run.job.summary()
    moments = run.config.params.moments_plan(run.table_dim) if run.scaling is not None else None
    privacy = privacy_report(job, moments)
    if privacy_only:
        return privacy
    return {"job_id": run.config.job_id, "job_type": run.config.job_type, "outcome": run.stage.value,
            "reason": run.outcome_reason, "total_seconds": round(run.clock() - run.started_at, 6),
            "steps": run.ledger.as_dict(), "bytes_total": run.ledger.bytes_total,
            "dropped": {p: run.drop_reasons.get(p, run.lobby.declined.get(p, "never joined"))
                        for p in sorted(run.dropped)},
            **job, **({"privacy": privacy} if privacy else {})}
