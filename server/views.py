"""What the operator sees of a run (`xclp-server job show` and `job list`, the Admin API's Show
and List): the stored record, and for a run this process runs now its live step, progress, step
ledger and each party's last sign of life. Nothing sensitive: states, counts, timings, reasons."""

from __future__ import annotations

from typing import TYPE_CHECKING

from xclp.server.config import JobConfig
from xclp.server.store import RunRecord
from xclp.v1 import xclp_pb2 as pb

if TYPE_CHECKING:
    from xclp.server.run import Run

LIVE_LEDGER_WAIT_SECONDS = 0.5  # job show waits this long for a busy run's live ledger, then shows the stored one


def run_info(record: RunRecord, job: Run | None, definition: JobConfig | None) -> pb.RunInfo:
    """A stored run, with the live step and timings if `job` (this process's run of it) runs now."""
    steps = record.steps
    info = pb.RunInfo(run_id=record.run_id, job_id=record.job_id, job_type=record.job_type, state=record.state,
                      reason=record.reason, created_at=record.created_at, started_at=record.started_at,
                      ended_at=record.ended_at, submitted_by=record.submitted_by, privacy=record.privacy)
    if not info.privacy:
        info.privacy = budget(definition)
    if job is not None and record.state in ("joining", "running"):
        activity = job.activity  # without the lock: a long coordinator computation holds it
        info.step, info.round, info.progress = activity.step, activity.round, activity.progress()
        if job.lock.acquire(timeout=LIVE_LEDGER_WAIT_SECONDS):  # the live ledger, or the stored one
            try:
                steps = job.ledger.as_dict()
            finally:
                job.lock.release()
    for p in record.parties:
        party = job.parties.get(p.party_id) if job is not None and record.state == "running" else None
        live = {} if job is None or party is None or not party.heard_at else {  # its last sign of life
            "silent_seconds": max(0.0, job.clock() - party.heard_at), "activity": party.activity}
        if job is not None and party is not None and (lost := party.lost_at) is not None:
            live["activity"] = (f"connection lost {job.clock() - lost:.0f} s ago; its place is kept for "
                                f"{job.config.reconnect_seconds:g} s")
        info.parties.add(party_id=p.party_id, state=p.state, rows=p.rows, joined_at=p.joined_at, reason=p.reason,
                         **live)
    for name, st in steps.items():
        info.steps.add(name=name, rounds=int(st["rounds"]), seconds=float(st["seconds"]),
                       bytes_in=int(st["bytes_in"]),
                       bytes_relayed=int(st["bytes_relayed"]), bytes_out=int(st["bytes_out"]),
                       recovered=[str(r) for r in st.get("recovered", [])])
        info.bytes_total += int(st["bytes_in"]) + int(st["bytes_relayed"]) + int(st["bytes_out"])
    return info


def budget(definition: JobConfig | None) -> str:
    """A DP job's budget from its definition, for a run that has not reported what it spent."""
    if definition is None:
        return ""
    params = definition.params
    epsilon, labels = params.epsilon_total, params.label_epsilon_total
    moments = f"DP moments ε = {params.moments_epsilon:g}" if params.moments_dp else ""
    if epsilon is not None:
        with_moments = " and its moments" if moments else ""
        return f"DP budget ε = {epsilon:g} over the job's releases{with_moments} (not yet spent)"
    parts = [f"label-DP budget ε = {labels:g} per label" if labels else "", moments]
    joined = "; ".join(p for p in parts if p)
    return f"{joined} (not yet spent)" if joined else ""
