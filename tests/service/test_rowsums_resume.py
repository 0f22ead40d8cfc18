"""A coordinator killed with SIGKILL after SecureHamming — in the labels step, in the influence solve,
or in SecureRowSums before anyone revealed — and started again on the same state goes on from the
graph (docs/operating.md): it asks for the labeled rows again, or solves and sends the influence
columns again and SecureRowSums runs at a later attempt among the same parties under fresh masks;
SecureHamming is never run again, and every party's scores are exactly the plaintext reference's.

The coordinator is a real `xclp-server serve` process (small_pieces_server.py: a checkpoint as
often as every 0.2 s; in the "solve" case its first process's solve never ends); the parties run on
threads. In the "rowsums" case party a holds on to its masked row sums (in the "labels" case, its
labeled rows) until the coordinator has been killed, so the kill lands with b's and c's in and a's
not.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import numpy as np
import pytest

from tests.harness import party_data, run_parties
from tests.service.test_resume import PARTIES, XCLP, KillableCoordinator
from xclp.client.jobs.xclp import XclpParty
from xclp.client.policy import PartyPolicy
from xclp.client.run_config import JobResult
from xclp.crypto.paillier import PaillierKeypair
from xclp.graph import GraphParams
from xclp.reference import xclp_reference
from xclp.server.phases.base import attempt_after_restart
from xclp.v1 import secure_hamming_wire as shw
from xclp.v1.xclp import LABELS_STEP


@pytest.mark.slow
@pytest.mark.parametrize("where", ["labels", "solve", "rowsums"])
def test_a_coordinator_killed_after_securehamming_goes_on_from_the_graph(keys, tmp_path: Path, monkeypatch,
                                                                        where: str) -> None:
    monkeypatch.setattr(shw, "PIECE_BYTES", 2 * 128)  # as the coordinator's (small_pieces_server.py)
    params = "".join(f"{k} = {str(v).lower() if isinstance(v, bool) else v}\n" for k, v in XCLP.items())
    env = {**os.environ, "XCLP_TEST_SOLVE_HANGS": "1" if where == "solve" else "0"}
    server = KillableCoordinator(tmp_path, keys, (
        'job_id = "x"\ntype = "xclp"\nexpected_parties = ["a", "b", "c"]\n'
        "[deadlines]\njoin_seconds = 120\nstep_seconds = 120\nreconnect_seconds = 60\n"
        f"[params]\n{params}"), env)
    killed = threading.Event()
    real, real_step = XclpParty._encoded_row_sums, XclpParty.on_step

    def holds_on(self, members):  # a's first masked row sums: after the kill
        if where == "rowsums" and self.party_id == "a" and not killed.is_set():
            killed.wait(120)
        return real(self, members)

    def holds_labels(self, step):  # a's first labeled rows: after the kill
        if where == "labels" and step.step == LABELS_STEP and self.party_id == "a" and not killed.is_set():
            killed.wait(120)
        return real_step(self, step)

    monkeypatch.setattr(XclpParty, "_encoded_row_sums", holds_on)
    monkeypatch.setattr(XclpParty, "on_step", holds_labels)
    datas = {p: party_data(90 + i, n=24) for i, p in enumerate(PARTIES)}
    paillier = {p: PaillierKeypair.generate(512, allow_insecure_test_size=True) for p in PARTIES}
    progress: dict[str, list[str]] = {}
    outcome: dict[str, dict] = {}
    parties = threading.Thread(target=lambda: outcome.update(results=run_parties(
        server.address, "x", keys, datas, paillier=paillier, progress=progress,
        policy=PartyPolicy(min_parties=3, insecure_test_keys=True))), daemon=True)
    def in_phase(got) -> bool:  # past SecureHamming: in the labels step, or in SecureRowSums or not
        saved = got.meta["job"]
        if where == "labels":
            return "graph" in saved and "labels" in saved
        # in the solve, "rowsums" is saved empty (none asked yet); in the labels step it is absent
        return "graph" in saved and "rowsums" in saved and bool(saved["rowsums"]) == (where == "rowsums")

    before = server.crash_once(parties, killed, in_phase, f"a checkpoint in the {where} phase",
                               {**env, "XCLP_TEST_SOLVE_HANGS": "0"})
    results = outcome["results"]
    assert all(isinstance(results[p], JobResult) for p in PARTIES), results
    said = server.said()
    assert "step secure_hamming" not in said  # SecureHamming's graph stands
    if where == "labels":  # the labeled rows again, at a later attempt, then the run as ever
        attempt = attempt_after_restart(int(before.meta["job"]["labels"]["attempt"]), len(PARTIES))
        assert f"the graph stands; the labeled rows are asked again at attempt {attempt}" in said, said
        assert f"step {LABELS_STEP} attempt {attempt} started with 3 parties" in said
        # each sent them twice (a's first, held, went out after the kill, for an attempt left)
        assert all(sum("labeled row numbers sent" in line for line in progress[p]) == 2 for p in PARTIES), progress
    else:
        saved = before.meta["job"]["rowsums"]
        attempt = attempt_after_restart(int(saved["attempt"]), len(PARTIES)) if where == "rowsums" else 0
        assert f"the influence columns are solved and sent again; SecureRowSums at attempt {attempt}" in said, said
        assert f"step rowsums attempt {attempt} started with 3 parties" in said
        assert f"step {LABELS_STEP}" not in said  # what came before stands
        for p in PARTIES:
            assert sum("the graph layout again (the coordinator restarted)" in line for line in progress[p]) == 1
    assert not os.listdir(tmp_path / "state" / "runs")
    seed = results["a"].seed  # type: ignore[union-attr]
    ref = xclp_reference([(datas[p].X, datas[p].y) for p in PARTIES], seed, 3, 64, GraphParams(k=4))
    for j, p in enumerate(PARTIES):
        unlabeled = datas[p].y == -1
        got = results[p].aggregate[unlabeled]  # type: ignore[union-attr]
        np.testing.assert_allclose(got, ref.scores[ref.party_rows(j)][unlabeled], rtol=0, atol=1e-6)
