"""The rounds engine fedavg and dbcl share (server/jobs/training.py, client/jobs/training.py):
what happens to a round when a party is lost, for each of the two trainers."""

from __future__ import annotations

import numpy as np
import pytest

from tests.harness import PARTIES, DiesAt, Recorder, allow_list, coordinator, job, run_parties
from tests.helpers import blobs
from xclp.client.policy import PartyPolicy

PARAMS = {
    "fedavg": {"n_classes": 3, "hidden": [8], "rounds": 3, "local_epochs": 2, "batch_size": 8, "learning_rate": 0.1,
               "momentum": 0.5, "pseudo_label": "network"},
    "dbcl": {"n_classes": 3, "hidden": [8], "rounds": 4, "batch_size": 6, "learning_rate": 0.05},
}


@pytest.mark.parametrize("job_type", ["fedavg", "dbcl"])
def test_a_party_lost_in_the_update_is_dropped_and_the_sum_restarts_without_it(keys, job_type: str) -> None:
    rec = Recorder()

    class Dies(DiesAt):
        at = "r1.update"
        first = staticmethod(lambda: rec.wait_for(("lost", "r1.update", 0, "a"), ("lost", "r1.update", 0, "b")))

    datas = {p: blobs(40 + i) for i, p in enumerate(PARTIES)}
    with coordinator(allow_list(keys), [job("lost", job_type, PARAMS[job_type])], observer=rec) as (coord, address):
        results = run_parties(address, "lost", keys, datas, sessions={"c": Dies},
                              policy=PartyPolicy(min_parties=2, allow_non_dp_dbcl=True))
        run = coord.jobs["lost"]
    assert isinstance(results["c"], KeyboardInterrupt)
    rounds = PARAMS[job_type]["rounds"]
    assert run.job.skipped == [] and run.dropped == {"c"}
    assert [h["parties"] for h in run.job.history] == [["a", "b", "c"]] + [["a", "b"]] * (rounds - 1)
    # the restarted sum opened to exactly the rows a and b trained on: fresh masks that cancel
    a, b = results["a"], results["b"]
    assert run.job.history[1]["rows"] == a.rounds[1].rows + b.rounds[1].rows
    np.testing.assert_array_equal(a.aggregate, b.aggregate)
    # round 1 attempt 0 (masked with c) and attempt 1 (without c) carry the same update under other masks
    first, second = rec.seen[("lost", "r1.update", 0, "a")], rec.seen[("lost", "r1.update", 1, "a")]
    assert np.mean(first == second) < 0.01
