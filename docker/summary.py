"""The compose demo's `summary` service: what the XCLP and FlyNN jobs achieved, per institution.

This service plays the **evaluator**, a role no real institution has: it reads the true labels
(`<party>.truth.csv`, which no institution's container mounts) and every institution's results
volume, and prints, for each institution, the accuracy on its unlabeled rows of

- XCLP (together): its predictions.csv from the XCLP job (DESIGN §5.7);
- alone (own LP): label propagation on its own rows only, same k, α, p (xclp.baselines);
- FlyNN (together / alone): the federated FlyNN model it received, and one trained on its own
  labeled rows with the same FlyHash (DESIGN §6; FlyNN trains on labeled rows only).

It also checks that every institution holds the same FlyNN model (FlyNN Theorem 4: the federated
counts are the pooled counts) and shows the coordinator's XCLP run summary (steps, dropouts).

It starts with the institutions and waits until each has written `finished` in its results
volume (docker/party.sh), or until the coordinator has finished (docker/coordinator.sh) and
XCLP_SUMMARY_GRACE seconds (30) have passed: an institution stopped mid-job never finishes, and
is reported as such. XCLP_SUMMARY_TIMEOUT (3600) bounds the whole wait.

Exit status: 0 when every institution has its predictions and the (common) FlyNN model, 1 when
something is missing or disagrees — the table still shows what there is.

    python docker/summary.py --jobs docker/jobs --data xclp/demo_data --results DIR --coordinator DIR
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from xclp import tables as party_data
from xclp.client.models import ModelFile
from xclp.server.config import JobConfig, load_job
from xclp.baselines import per_client_lp
from xclp.demo import truth as read_truth
from xclp.errors import XclpError
from xclp.flynn import FlyNNModel
from xclp.v1.jobs import XclpJobParams

PREDICTIONS = "predictions.csv"
FLYNN_MODEL = "flynn-model.npz"
FINISHED = "finished"  # written last by docker/party.sh and docker/coordinator.sh
POLL_SECONDS = 1.0


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
    """(the xclp job, the flynn job or None) among the job files of `directory`."""
    configs = [load_job(p) for p in sorted(directory.glob("*.toml"))]
    xclp = [c for c in configs if c.job_type == "xclp"]
    flynn = [c for c in configs if c.job_type == "flynn"]
    if len(xclp) != 1 or len(flynn) > 1:
        raise SystemExit(f"summary: {directory} must hold one xclp job file and at most one flynn job file")
    return xclp[0], flynn[0] if flynn else None


def _predictions(path: Path, ids: tuple[str, ...]) -> np.ndarray:
    """int64[n] XCLP labels in the order of `ids`; every own row id must be there exactly once."""
    with open(path, newline="") as fh:
        rows = {r["id"]: int(r["label"]) for r in csv.DictReader(fh)}
    if sorted(rows) != sorted(ids):
        raise ValueError(f"{path} does not hold exactly the institution's own row ids")
    return np.array([rows[i] for i in ids], dtype=np.int64)


def _status(results: Path) -> str:
    """The party's own account of its runs (docker/party.sh writes `<job> <exit code>` lines)."""
    try:
        return ", ".join(line.replace(" ", " exit ") for line in (results / "status").read_text().split("\n") if line)
    except OSError:
        return "no status: the container did not finish"


def evaluate(party: str, data_dir: Path, results: Path, xclp: XclpJobParams) -> tuple[Row, ModelFile | None]:
    data = party_data.load(data_dir / f"{party}.csv", id_column="row_id")
    assert data.y is not None, "the demo CSVs carry a label column"
    truth = read_truth(data_dir / f"{party}.truth.csv", data.ids)
    unlabeled = ~data.labeled
    missing: list[str] = []

    def accuracy(labels: np.ndarray) -> float:
        return float(np.mean(labels[unlabeled] == truth[unlabeled]))

    together = None
    if not (results / PREDICTIONS).exists():
        missing.append(f"no {PREDICTIONS}")
    else:
        try:
            together = accuracy(_predictions(results / PREDICTIONS, data.ids))
        except (OSError, KeyError, ValueError) as exc:
            missing.append(f"unreadable {PREDICTIONS} ({exc})")
    graph = xclp.graph_params
    alone = accuracy(per_client_lp(data.X, data.y, xclp.n_classes, graph, normalise_labels=xclp.label_norm).labels)

    model = flynn = flynn_alone = None
    if not (results / FLYNN_MODEL).exists():
        missing.append(f"no {FLYNN_MODEL}")
    else:
        try:
            model = ModelFile.load(results / FLYNN_MODEL)
            federated = model.flynn()
            tie_seed = model.params.tie_seed  # type: ignore[union-attr]
            flynn = accuracy(federated.predict(data.X, tie_seed=tie_seed))
            own = FlyNNModel.train(federated.flyhash, data.X[data.labeled], data.y[data.labeled], federated.n_classes)
            flynn_alone = accuracy(own.predict(data.X, tie_seed=tie_seed))
        except (OSError, XclpError) as exc:
            missing.append(f"unreadable {FLYNN_MODEL} ({exc})")
    if missing:
        missing = [f"{', '.join(missing)} ({_status(results)})"]
    return Row(party, int(unlabeled.sum()), together, alone, flynn, flynn_alone, tuple(missing)), model


def _finished_since(path: Path, start: float) -> bool:
    """`path` exists and was written in this run (not left over from an earlier `up`)."""
    try:
        return path.stat().st_mtime >= start
    except OSError:
        return False


def wait_for_run(coordinator: Path, results: dict[str, Path], grace: float, timeout: float) -> list[str]:
    """Block until every institution finished, or the coordinator finished `grace` seconds ago;
    returns the institutions that did not finish."""
    give_up = time.monotonic() + timeout
    while not (coordinator / "started").exists() and time.monotonic() < give_up:
        time.sleep(POLL_SECONDS)  # only before the coordinator's first start
    try:
        start = (coordinator / "started").stat().st_mtime
    except OSError:
        return sorted(results)
    print(f"summary: waiting for {', '.join(results)} to finish", file=sys.stderr, flush=True)
    coordinator_done_at: float | None = None
    while True:
        pending = [p for p, d in results.items() if not _finished_since(d / FINISHED, start)]
        now = time.monotonic()
        if not pending or now >= give_up:
            return pending
        if coordinator_done_at is None and _finished_since(coordinator / FINISHED, start):
            coordinator_done_at = now
        if coordinator_done_at is not None and now - coordinator_done_at >= grace:
            print(f"summary: the coordinator finished {grace:.0f}s ago; {', '.join(pending)} did not",
                  file=sys.stderr, flush=True)
            return pending
        time.sleep(POLL_SECONDS)


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _run_summary(path: Path) -> str:
    try:
        run = json.loads(path.read_text())
    except (OSError, ValueError):
        return f"(no run summary at {path}: the coordinator did not finish the job)"
    timed = sorted(((s["seconds"], name) for name, s in run["steps"].items() if s.get("seconds", 0) >= 0.05),
                   reverse=True)
    steps = ", ".join(f"{name} {seconds:.1f}s" for seconds, name in timed) + ", the rest < 0.1s"
    dropped = ", ".join(f"{p} ({why})" for p, why in run["dropped"].items()) or "none"
    return (f"{run['outcome']} in {run['total_seconds']:.1f}s, {run['bytes_total'] / 1e6:.1f} MB moved "
            f"({run['params']['key_bits']}-bit Paillier, L = {run['params']['lsh_bits']}); dropped: {dropped}\n"
            f"  steps: {steps}\n  graph built from: {', '.join(run['graph_parties'])}; "
            f"labels from: {', '.join(run['label_parties'])}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--jobs", type=Path, default=Path("/etc/xclp/jobs"), help="the coordinator's job files")
    p.add_argument("--data", type=Path, default=Path("/evaluation"), help="<party>.csv and <party>.truth.csv")
    p.add_argument("--results", type=Path, default=Path("/results"), help="<party>/ = that institution's results volume")
    p.add_argument("--coordinator", type=Path, default=Path("/coordinator"), help="the coordinator's volume")
    p.add_argument("--parties", default=os.environ.get("XCLP_PARTIES", "hospital-a hospital-b hospital-c"))
    args = p.parse_args(argv)
    xclp_job, flynn_job = _jobs(args.jobs)
    assert isinstance(xclp_job.params, XclpJobParams)

    parties = args.parties.split()
    wait_for_run(args.coordinator, {p: args.results / p for p in parties},
                 grace=float(os.environ.get("XCLP_SUMMARY_GRACE", "30")),
                 timeout=float(os.environ.get("XCLP_SUMMARY_TIMEOUT", "3600")))
    rows, models = [], {}
    for party in parties:
        row, model = evaluate(party, args.data, args.results / party, xclp_job.params)
        rows.append(row)
        if model is not None:
            models[party] = model

    print("\n=== xclp compose demo: summary ===")
    print("(this service plays the evaluator: it reads the true labels, which no institution ever sees)\n")
    summary_path = None if xclp_job.summary_path is None else args.coordinator / "jobs" / xclp_job.summary_path.name
    print(f"XCLP job {xclp_job.job_id}: " + ("(no run summary configured)" if summary_path is None
                                            else _run_summary(summary_path)))
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
