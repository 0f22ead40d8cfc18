"""A party whose process is killed with SIGKILL in the middle of a training round, and started again
with the same command, rejoins its run (docs/operating.md): it reads its sealed run state back (the
round, its model, its update and DP noise), the coordinator sends it the round's model again and
starts the round's update sum again with it among the same parties, it masks the same update under
fresh masks, and the trained model is exactly the simulation's.

Party a is a real `xclp-client run` process; b and c run on threads against an in-process
coordinator. b holds on to its round-1 training until a has been killed and has rejoined, so the
kill lands with a's masked update of round 1 in and b's not.
"""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from tests.harness import allow_list, coordinator, job, party_data, run_parties
from tests.service.test_party_restart import PARTIES, KillableParty
from tests.service.test_training_resume import DBCL, FEDAVG, FEDAVG_XCLP
from xclp.client.jobs.dbcl import DbclTrainer
from xclp.client.jobs.fedavg import FedavgTrainer
from xclp.client.policy import PartyPolicy
from xclp.client.run_config import JobResult
from xclp.client.run_state import RUNS_DIR, RunStateFile
from xclp.crypto.paillier import PaillierKeypair
from xclp.simulation import run_dbcl, run_fedavg
from xclp.v1.dbcl import DbclJobParams
from xclp.v1.fedavg import FedavgJobParams


@pytest.mark.slow
@pytest.mark.parametrize("job_type", ["fedavg", "dbcl", "fedavg-xclp"])
def test_a_party_killed_mid_round_and_started_again_rejoins_its_run(keys, tmp_path: Path, monkeypatch,
                                                                    job_type: str) -> None:
    """fedavg-xclp: round 1 ran XCLP before its update; a's state, kept once it has its update
    (its pseudo-labels are not kept), rejoins the update sum. Before, a party in such a round kept
    no state, and its restart was a drop."""
    params = {"fedavg": FEDAVG, "dbcl": DBCL, "fedavg-xclp": FEDAVG_XCLP}[job_type]
    xclp = job_type == "fedavg-xclp"
    job_type = job_type.split("-")[0]
    datas = {p: party_data(140 + i) for i, p in enumerate(PARTIES)}
    keys_512 = ["--paillier-bits", "512", "--insecure-test-keys"] if xclp else []
    party = KillableParty(tmp_path, keys, datas["a"], "t", [sys.executable, "-m", "xclp.client.cli"],
                          ["--out", str(tmp_path / "out"), "--min-parties", "2", "--state", str(tmp_path / "state"),
                           "--allow-non-dp-dbcl", *keys_512])
    paillier = {p: PaillierKeypair.generate(512, allow_insecure_test_size=True) for p in "bc"} if xclp else None
    killed = threading.Event()
    trainer = FedavgTrainer if job_type == "fedavg" else DbclTrainer
    real = trainer.train

    def holds_on(self, t, started):  # b's round-1 update: once a has rejoined
        if self.ctx.party_id == "b" and t == 1:
            killed.wait(120)
        return real(self, t, started)

    monkeypatch.setattr(trainer, "train", holds_on)
    config = job("t", job_type, params, min_parties=2, step_seconds=120, reconnect_seconds=60)
    state = RunStateFile(tmp_path / "state", "a", "t", keys["a"])
    outcome: dict[str, dict] = {}
    progress: dict[str, list[str]] = {}
    with coordinator(allow_list(keys), [config]) as (coord, address):
        party.start(address)
        others = threading.Thread(target=lambda: outcome.update(results=run_parties(
            address, "t", keys, {p: datas[p] for p in "bc"}, progress=progress, paillier=paillier,
            policy=PartyPolicy(min_parties=2, allow_non_dp_dbcl=True, insecure_test_keys=xclp))), daemon=True)
        try:
            others.start()

            def masked_in_round_one() -> bool:  # a's masked update of round 1 is in, and its state has it
                run = coord.jobs.get("t")
                step = run.step if run is not None else None
                if step is None or step.wire != "r1.update" or "a" in step.pending or not state.path.exists():
                    return False
                saved = state.load()
                return saved is not None and saved.meta["job"]["round"] == 1 and saved.meta["job"]["rows"] is not None

            party.wait_until(masked_in_round_one, 120, "a's masked update of round 1")
            party.kill()
            party.start(address, again=True)
            party.wait_until(lambda: coord.jobs["t"].step is not None and coord.jobs["t"].step.attempt == 1, 60,
                             "the round's sum to start again with a")
            said = party.finish(killed, others)
        finally:
            killed.set()
            party.close()
    assert "round 1: started again by the coordinator; the same model, and the same update under fresh masks" \
        in said, said
    assert "round 1: model received" not in said  # it did not train round 1 again
    assert not state.path.exists() and not os.listdir(tmp_path / "state" / RUNS_DIR)
    results = outcome["results"]
    assert all(isinstance(results[p], JobResult) for p in "bc"), results
    assert all(results[p].participants == PARTIES for p in "bc")  # type: ignore[union-attr]
    pooled = {q: (d.X, d.y) for q, d in datas.items()}
    seed = results["b"].seed  # type: ignore[union-attr]
    resolution = 3 * 2.0 ** -24
    if job_type == "fedavg":
        sim = run_fedavg(pooled, FedavgJobParams.parse(params), seed=seed, xclp="secure" if xclp else "reference")
        model, atol = sim.model.flat, 4 * resolution
    else:
        seeds = [r.seed for r in results["b"].rounds]  # type: ignore[union-attr]
        model = run_dbcl(pooled, DbclJobParams.parse(params), seed=seed, round_seeds=seeds).model.flat
        atol = DBCL["learning_rate"] / (1 - DBCL["momentum"]) * resolution * 5
    for p in "bc":
        np.testing.assert_allclose(results[p].aggregate, model, rtol=0, atol=atol)  # type: ignore[union-attr]
