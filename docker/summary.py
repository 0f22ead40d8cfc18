"""The compose demo's `summary` service: what the XCLP and FlyNN jobs achieved, per institution.

This service plays the **evaluator**, a role no real institution has: it reads the true labels
(`<party>.truth.csv`, which no institution's container mounts) and every institution's results
volume, and prints, for each institution, the accuracy on its unlabeled rows of

- XCLP (together): its predictions.csv from the XCLP job (docs/design.md §5.7);
- alone (own LP): label propagation on its own rows only, same k, α, p (xclp.baselines);
- FlyNN (together / alone): the federated FlyNN model it received, and one trained on its own
  labeled rows with the same FlyHash (docs/design.md §6; FlyNN trains on labeled rows only).

It also checks that every institution holds the same FlyNN model (FlyNN Theorem 4: the federated
counts are the pooled counts) and shows the coordinator's XCLP run summary (steps, dropouts).

The `submit` service (docker/submit.sh) runs it once the runs are over, with their records from
`xclp-server job submit --wait --json`. It reads each institution's outputs of those runs from its
results volume (`runs/<job>/<run>/`, docker/agent.sh), waiting up to XCLP_SUMMARY_GRACE seconds
(30) for an agent still writing them; an institution that dropped out of a run is reported with
the coordinator's reason.

Exit status: 0 when every institution has its predictions and the (common) FlyNN model, 1 when
something is missing or disagrees — the table still shows what there is.

    python docker/summary.py --runs runs.json --jobs docker/jobs --data xclp/demo_data --results DIR
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from xclp.baselines import per_client_lp
from xclp.client.models import ModelFile
from xclp.data import tables as party_data
from xclp.demo import predictions as read_predictions
from xclp.demo import truth as read_truth
from xclp.errors import XclpError
from xclp.flynn import FlyNNModel
from xclp.server.config import JobConfig, load_job
from xclp.v1 import registry
from xclp.v1.registry import ModelKind, Output
from xclp.v1.xclp import XclpJobParams

PREDICTIONS = "predictions.csv"
FLYNN_MODEL = "model.npz"
POLL_SECONDS = 0.5


@dataclass(frozen=True)
class Row:
    """One institution's line of the table; None = no result (the reason is in `missing`)."""

    party: str
    unlabeled: int
    xclp: float | None
    alone: float
    flynn: float | None
    flynn_alone: float | None
    missing: tuple[str, ...]


def _jobs(directory: Path) -> tuple[JobConfig, JobConfig | None]:
    """(the job that labels rows, the FlyNN model's or None) among the job files of `directory`, by
    what the registry says each type writes."""
    configs = [load_job(p) for p in sorted(directory.glob("*.toml"))]
    xclp = [c for c in configs if registry.get(c.job_type).output is Output.PREDICTIONS]
    flynn = [c for c in configs if registry.get(c.job_type).model is ModelKind.FLYNN]
    if len(xclp) != 1 or len(flynn) > 1:
        raise SystemExit(f"summary: {directory} must hold one xclp job file and at most one flynn job file")
    return xclp[0], flynn[0] if flynn else None


def run_dir(results: Path, party: str, run: dict | None, grace: float) -> tuple[Path | None, str]:
    """(the party's output directory of `run`, or None and why there is none)."""
    if run is None:
        return None, "no such run was submitted"
    states = {p["party_id"]: p for p in run.get("parties", [])}
    me = states.get(party, {"state": "never joined", "reason": ""})
    if me["state"] != "joined":
        why = f" ({me['reason']})" if me.get("reason") else ""
        return None, f"{me['state']} in {run['job_id']} run {run['run_id']}{why}"
    if run["state"] != "done":
        return None, f"{run['job_id']} run {run['run_id']} is {run['state']}: {run.get('reason', '')}"
    path = results / party / "runs" / run["job_id"] / run["run_id"]
    give_up = time.monotonic() + grace
    while not path.is_dir() and time.monotonic() < give_up:
        time.sleep(POLL_SECONDS)  # the agent writes its outputs right after the run's end
    return (path, "") if path.is_dir() else (None, f"no outputs of {run['job_id']} run {run['run_id']} "
                                             f"(see {party}'s log)")


def evaluate(party: str, data_dir: Path, xclp_dir: tuple[Path | None, str],
             flynn_dir: tuple[Path | None, str] | None, xclp: XclpJobParams) -> tuple[Row, ModelFile | None]:
    """One institution's line: `xclp_dir` and `flynn_dir` are its run directories (or None and why);
    `flynn_dir` None: the demo has no FlyNN job."""
    data = party_data.load(data_dir / f"{party}.csv", id_column="row_id")
    assert data.y is not None, "the demo CSVs carry a label column"
    truth = read_truth(data_dir / f"{party}.truth.csv", data.ids)
    unlabeled = ~data.labeled
    missing: list[str] = []

    def accuracy(labels: np.ndarray) -> float:
        return float(np.mean(labels[unlabeled] == truth[unlabeled]))

    together = None
    if xclp_dir[0] is None:
        missing.append(f"no {PREDICTIONS}: {xclp_dir[1]}")
    else:
        try:
            together = accuracy(read_predictions(xclp_dir[0] / PREDICTIONS, data.ids))
        except (OSError, KeyError, ValueError) as exc:
            missing.append(f"unreadable {PREDICTIONS} ({exc})")
    graph = xclp.graph_params
    alone = accuracy(per_client_lp(data.X, data.y, xclp.n_classes, graph, normalise_labels=xclp.label_norm).labels)

    model = flynn = flynn_alone = None
    if flynn_dir is None:
        pass
    elif flynn_dir[0] is None:
        missing.append(f"no FlyNN model: {flynn_dir[1]}")
    else:
        try:
            model = ModelFile.load(flynn_dir[0] / FLYNN_MODEL)
            loaded = model.loaded()  # client/jobs/allreduce.py FlynnPredictor
            federated, tie_seed = loaded.model, loaded.tie_seed
            flynn = accuracy(federated.predict(data.X, tie_seed=tie_seed))
            own = FlyNNModel.train(federated.flyhash, data.X[data.labeled], data.y[data.labeled], federated.n_classes)
            flynn_alone = accuracy(own.predict(data.X, tie_seed=tie_seed))
        except (OSError, XclpError) as exc:
            missing.append(f"unreadable {FLYNN_MODEL} ({exc})")
    if missing:
        missing = ["; ".join(missing)]
    return Row(party, int(unlabeled.sum()), together, alone, flynn, flynn_alone, tuple(missing)), model


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _run_summary(run: dict | None) -> str:
    """The coordinator's record of a run (`xclp-server job show --json`): outcome, time, bytes, steps."""
    if run is None:
        return "(not submitted)"
    timed = sorted(((s.get("seconds", 0.0), s["name"]) for s in run.get("steps", []) if s.get("seconds", 0) >= 0.05),
                   reverse=True)
    steps = ", ".join(f"{name} {seconds:.1f}s" for seconds, name in timed) + ", the rest < 0.1s"
    dropped = ", ".join(f"{p['party_id']} ({p['reason'] or p['state']})" for p in run.get("parties", [])
                        if p["state"] != "joined") or "none"
    return (f"run {run['run_id']} {run['state']} in {run.get('duration_seconds', 0.0):.1f}s, "
            f"{int(run.get('bytes_total', 0)) / 1e6:.1f} MB moved; dropped: {dropped}\n  steps: {steps}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--runs", type=Path, required=True, help="the runs' records: `xclp-server job submit --wait --json`")
    p.add_argument("--jobs", type=Path, default=Path("/etc/xclp/jobs"), help="the submitted job files")
    p.add_argument("--data", type=Path, default=Path("/evaluation"), help="<party>.csv and <party>.truth.csv")
    p.add_argument("--results", type=Path, default=Path("/results"),
                   help="<party>/ = that institution's results volume")
    p.add_argument("--parties", default=os.environ.get("XCLP_PARTIES", "hospital-a hospital-b hospital-c"))
    args = p.parse_args(argv)
    xclp_job, flynn_job = _jobs(args.jobs)
    assert isinstance(xclp_job.params, XclpJobParams)

    parties = args.parties.split()
    try:
        records = json.loads(args.runs.read_text())
    except (OSError, ValueError) as exc:
        raise SystemExit(f"summary: cannot read the runs' records {args.runs}: {exc}") from None
    records = records if isinstance(records, list) else [records]
    runs = {r["job_id"]: r for r in records}
    xclp_run, flynn_run = runs.get(xclp_job.job_id), runs.get(flynn_job.job_id) if flynn_job else None
    grace = float(os.environ.get("XCLP_SUMMARY_GRACE", "30"))
    rows, models = [], {}
    for party in parties:
        row, model = evaluate(party, args.data, run_dir(args.results, party, xclp_run, grace),
                              None if flynn_job is None else run_dir(args.results, party, flynn_run, grace),
                              xclp_job.params)
        rows.append(row)
        if model is not None:
            models[party] = model

    print("\n=== xclp compose demo: summary ===")
    print("(this service plays the evaluator: it reads the true labels, which no institution ever sees)\n")
    print(f"XCLP job {xclp_job.job_id}: {_run_summary(xclp_run)}")
    if flynn_job is not None:
        print(f"FlyNN job {flynn_job.job_id}: {_run_summary(flynn_run)}")
    print("\naccuracy on each institution's unlabeled rows")
    print(f"{'institution':<14}{'unlabeled':>10}{'XCLP (together)':>18}{'alone (own LP)':>17}"
          f"{'FlyNN (together)':>19}{'FlyNN (alone)':>16}")
    for r in rows:
        print(f"{r.party:<14}{r.unlabeled:>10}{_fmt(r.xclp):>18}{r.alone:>17.3f}{_fmt(r.flynn):>19}{_fmt(r.flynn_alone):>16}")

    problems = [f"{r.party}: {m}" for r in rows for m in r.missing]
    if flynn_job is not None and models:
        first = next(iter(models.values()))
        same = all(np.array_equal(m.aggregate, first.aggregate) and m.seed == first.seed for m in models.values())
        print(f"\nFlyNN job {flynn_job.job_id}: model of {len(models)} institution(s) "
              f"({', '.join(models)}) {'identical everywhere' if same else 'DIFFERS between institutions'};\n"
              f"  trained on {int(first.aggregate.sum() // first.params.rho)} labeled rows in all")  # type: ignore[union-attr]
        if not same:
            problems.append("the institutions' FlyNN models differ")
    if problems:
        print("\nmissing or wrong:\n  " + "\n  ".join(problems))
        return 1
    print("\nevery institution has its predictions.csv and the FlyNN model (in its results volume)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
