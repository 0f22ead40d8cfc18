"""A coordinator killed with SIGKILL in the middle of a FedAvg or DBCL round and started again on the same
state goes on at that round ("training resumes at the round"): the rounds before
stand, the round runs again from its start with the same model, its update sum at a later attempt
among the same parties under fresh masks (DBCL: the round's view again, from the same seed), and the
trained model is exactly the simulation's.

The coordinator is a real `xclp-server serve` process (small_pieces_server.py: a checkpoint as often
as every 0.2 s); the parties run on threads. Party a holds on to its round-1 training until the
coordinator has been killed, so the kill lands with b's and c's masked updates in and a's not.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import numpy as np
import pytest

from tests.harness import PARTIES, run_parties
from tests.helpers import blobs
from tests.service.test_resume import KillableCoordinator
from xclp.client.jobs.dbcl import DbclTrainer
from xclp.client.jobs.fedavg import FedavgTrainer
from xclp.client.policy import PartyPolicy
from xclp.client.run_config import JobResult
from xclp.crypto.paillier import PaillierKeypair
from xclp.server.phases.base import attempt_after_restart
from xclp.simulation import run_dbcl, run_fedavg
from xclp.v1 import secure_hamming_wire as shw
from xclp.v1.dbcl import DbclJobParams
from xclp.v1.fedavg import FedavgJobParams

FEDAVG = {"n_classes": 3, "hidden": [8], "rounds": 3, "local_epochs": 2, "batch_size": 8, "learning_rate": 0.1,
          "momentum": 0.5, "pseudo_label": "none"}
# round 0 on labeled rows, rounds 1 and 2 with XCLP pseudo-labels among the round's parties
FEDAVG_XCLP = {**FEDAVG, "pseudo_label": "xclp", "warmup_rounds": 1, "k": 4, "lsh_bits": 64, "key_bits": 512,
               "insecure_test_keys": True}
DBCL = {"n_classes": 3, "hidden": [8], "rounds": 3, "batch_size": 6, "learning_rate": 0.05, "sketch": "countsketch",
        "optimiser": "sgd", "momentum": 0.5}


@pytest.mark.slow
@pytest.mark.parametrize("job_type", ["fedavg", "dbcl", "fedavg-xclp"])
def test_a_coordinator_killed_mid_round_goes_on_at_that_round(keys, tmp_path: Path, monkeypatch, job_type) -> None:
    """fedavg-xclp: round 1 ran XCLP among its parties before its update sum; the round goes on with
    its update sum, XCLP not run again (the parties hold their pseudo-labels and updates). Before,
    such a round was never saved, and the crash interrupted the run."""
    job = {"fedavg": FEDAVG, "dbcl": DBCL, "fedavg-xclp": FEDAVG_XCLP}[job_type]
    xclp = job_type == "fedavg-xclp"
    monkeypatch.setattr(shw, "PIECE_BYTES", 2 * 128)  # as the coordinator's (small_pieces_server.py)
    job_type = job_type.split("-")[0]
    params = "".join(f"{k} = {json.dumps(v)}\n" for k, v in job.items())
    server = KillableCoordinator(tmp_path, keys, (
        f'job_id = "t"\ntype = "{job_type}"\nexpected_parties = ["a", "b", "c"]\nmin_parties = 2\n'
        "[deadlines]\njoin_seconds = 120\nstep_seconds = 120\nreconnect_seconds = 60\n"
        f"[params]\n{params}"))
    killed = threading.Event()
    trainer = FedavgTrainer if job_type == "fedavg" else DbclTrainer
    real = trainer.train

    def holds_on(self, t, started):  # a's round-1 update: after the kill
        if self.ctx.party_id == "a" and t == 1:
            killed.wait(120)
        return real(self, t, started)

    monkeypatch.setattr(trainer, "train", holds_on)
    datas = {p: blobs(i) for i, p in enumerate(PARTIES)}
    progress: dict[str, list[str]] = {}
    outcome: dict[str, dict] = {}
    paillier = {p: PaillierKeypair.generate(512, allow_insecure_test_size=True) for p in PARTIES} if xclp else None
    parties = threading.Thread(target=lambda: outcome.update(results=run_parties(
        server.address, "t", keys, datas, progress=progress, paillier=paillier,
        policy=PartyPolicy(min_parties=2, allow_non_dp_dbcl=True, insecure_test_keys=xclp))), daemon=True)
    before = server.crash_once(parties, killed, lambda got: got.meta["job"]["round"] == 1,
                               "a checkpoint of round 1's update sum")
    results = outcome["results"]
    assert all(isinstance(results[p], JobResult) for p in PARTIES), results
    said = server.said()
    attempt = attempt_after_restart(int(before.meta["job"]["attempt"]), len(PARTIES))
    assert f"round 1 goes on with its model again, its update sum at attempt {attempt}" in said, said
    assert f"step r1.update attempt {attempt} started with 3 parties" in said
    assert "step r0." not in said  # round 0 stands: it is not run again
    assert "step r1.secure_hamming" not in said and "step r1.rowsums" not in said  # nor round 1's XCLP
    assert ("step r2.secure_hamming" in said) == xclp
    for p in PARTIES:
        again = [line for line in progress[p] if line.startswith("round 1: started again by the coordinator")]
        assert len(again) == 1, progress[p]
        assert [r.round for r in results[p].rounds] == [0, 1, 2]  # type: ignore[union-attr]
    assert not os.listdir(tmp_path / "state" / "runs")
    seed = results["a"].seed  # type: ignore[union-attr]
    pooled = {q: (d.X, d.y) for q, d in datas.items()}
    resolution = 3 * 2.0 ** -24  # each of 3 parties' update is rounded once to 2^-frac_bits
    if job_type == "fedavg":
        sim = run_fedavg(pooled, FedavgJobParams.parse(job), seed=seed, xclp="secure" if xclp else "reference")
        model, atol = sim.model.flat, 4 * resolution
    else:  # the round's seed again: the same sketches, the same view, the same W at the end
        seeds = [r.seed for r in results["a"].rounds]  # type: ignore[union-attr]
        assert len(set(seeds)) == 3 and all([r.seed for r in results[p].rounds] == seeds  # type: ignore[union-attr]
                                            for p in PARTIES)
        sim = run_dbcl(pooled, DbclJobParams.parse(job), seed=seed, round_seeds=seeds)
        model, atol = sim.model.flat, DBCL["learning_rate"] / (1 - DBCL["momentum"]) * resolution * 5
    for p in PARTIES:
        np.testing.assert_allclose(results[p].aggregate, model, rtol=0, atol=atol)  # type: ignore[union-attr]
