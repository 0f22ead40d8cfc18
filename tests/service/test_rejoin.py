"""A coordinator stopped or killed where its run cannot go on (FlyNN has no checkpoint): the run is
interrupted, and the parties join the job's next run (client/api.py take_part, `--rejoins`).

The coordinator is a real `xclp-server serve` process on a job file (test_resume.KillableCoordinator);
a, b and c are sessions in this process, as `xclp-client run` makes them. Party a is held in the
masked sum of the first run while the coordinator is stopped (SIGTERM: a waiting party hears JobEnd
INTERRUPTED, or reconnects) or killed (SIGKILL: the parties' reconnections are told the run was
interrupted) and
started again on the same state, where it opens the job's next run. Each party says it joins the
next run, and the counts they get are the pooled counts under that run's hash functions. With
`rejoins = 0` each stops with RunInterrupted, its exit code that of a dropped run.
"""

from __future__ import annotations

import signal
import threading
from pathlib import Path

import numpy as np
import pytest

from tests.harness import allow_list, on_threads, party_data
from tests.service.test_resume import KillableCoordinator, wait_until
from xclp.client.api import PartyResult, take_part
from xclp.client.connection import ConnectionConfig
from xclp.client.jobs.allreduce import AllReduceParty
from xclp.client.policy import PartyPolicy
from xclp.client.run_config import RunConfig
from xclp.errors import RunInterrupted
from xclp.flynn import FlyHash, FlyNNParams, train_counts
from xclp.v1.exits import EXIT_DROPPED, exit_code

PARTIES = ("a", "b", "c")
JOB = ('job_id = "f"\ntype = "flynn"\nexpected_parties = ["a", "b", "c"]\n'
       "[deadlines]\njoin_seconds = 120\nstep_seconds = 120\nreconnect_seconds = 60\n"
       "[params]\nn_classes = 3\nm = 128\ns = 2\nrho = 8\n")

pytestmark = pytest.mark.slow


def run_with_a_restart(tmp_path: Path, keys, monkeypatch, sig: signal.Signals, rejoins: int):
    """The three parties' results (or errors), their progress lines and the coordinator."""
    server = KillableCoordinator(tmp_path, keys, JOB)
    held, restarted = threading.Event(), threading.Event()
    real = AllReduceParty.on_step

    def holds_on(self, step):  # a, in the first run's sum, until the coordinator has restarted
        if self.ctx.party_id == "a" and not held.is_set():
            held.set()
            restarted.wait(120)
        return real(self, step)

    monkeypatch.setattr(AllReduceParty, "on_step", holds_on)
    datas = {p: party_data(40 + i, n=40) for i, p in enumerate(PARTIES)}
    said: dict[str, list[str]] = {p: [] for p in PARTIES}

    def party(p: str) -> PartyResult:
        config = RunConfig("f", p, keys[p], ConnectionConfig(server.address, insecure=True), join_wait_seconds=60,
                           idle_seconds=120, peers=allow_list(keys), policy=PartyPolicy(min_parties=3), workers=0)
        return take_part(config, lambda params: datas[p], progress=said[p].append, rejoins=rejoins)

    outcome: dict[str, dict] = {}
    parties = threading.Thread(target=lambda: outcome.update(results=on_threads(PARTIES, party, 240)), daemon=True)
    try:
        parties.start()
        wait_until(held.is_set, 120, "a to be held in the first run's sum", server.process)
        server.restart(sig)
        restarted.set()
        parties.join(240)
        assert not parties.is_alive()
    finally:
        restarted.set()
        server.close()
    return outcome["results"], said, datas, server


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["killed", "stopped"])
def test_parties_join_the_jobs_next_run_after_the_coordinator_lost_theirs(keys, tmp_path: Path, monkeypatch,
                                                                          sig) -> None:
    results, said, datas, server = run_with_a_restart(tmp_path, keys, monkeypatch, sig, rejoins=3)
    assert all(isinstance(results[p], PartyResult) for p in PARTIES), results
    X = np.vstack([datas[p].X for p in PARTIES])
    y = np.concatenate([datas[p].y for p in PARTIES])
    seed = results["a"].job.seed  # type: ignore[union-attr]
    want = train_counts(FlyHash.from_seed(seed, FlyNNParams(X.shape[1], 128, 2, 8)), X[y >= 0], y[y >= 0], 3)
    for p in PARTIES:
        result = results[p]
        assert isinstance(result, PartyResult) and result.job.seed == seed
        np.testing.assert_array_equal(result.job.aggregate, want)
        lines = [line for line in said[p] if "joining the job's next run (1 of at most 3 times" in line]
        # stopped, a party hears JobEnd INTERRUPTED if its stream delivers it before the stop cuts the
        # stream (then it reconnects); else, as when killed, the restarted coordinator tells it
        why = ["run 1 of job 'f' was interrupted: the coordinator stopped while it was in flight, and restarted",
               *(["the coordinator is shutting down; run 1 is interrupted"] if sig == signal.SIGTERM else [])]
        assert len(lines) == 1 and lines[0].startswith(tuple(why)), said[p]
        assert sum("joined job f" in line for line in said[p]) == 2
    assert "runs open: f (run 2)" in server.said()


def test_without_rejoins_each_party_stops_with_the_interruption(keys, tmp_path: Path, monkeypatch) -> None:
    results, said, _, _ = run_with_a_restart(tmp_path, keys, monkeypatch, signal.SIGKILL, rejoins=0)
    for p in PARTIES:
        error = results[p]
        assert isinstance(error, RunInterrupted), (p, error)
        assert "run 1 of job 'f' was interrupted" in str(error) and exit_code(error) == EXIT_DROPPED
        assert not any("next run" in line for line in said[p])
