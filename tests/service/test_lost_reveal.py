"""A party lost while revealing its self mask, with real processes (docs/design.md §6.1).

One coordinator (in this process, so the test reads its ledger) serves one job of every type that
sums under masks; in each, party c is a real `xclp-client run` process that SIGKILLs itself when
the reveal of one sum starts (tests/service/reveal_dying_party.py): its masked contribution is
held and confirmed, its seed never revealed. a and b give their Shamir shares of c's seed (t = 2
of 3), the coordinator rebuilds it and opens the sum over all three, and the job completes for a
and b with exactly the plaintext reference's result over all three tables (c's counts, moments,
row sums, update are in it). Before seed shares each of these sums failed instead.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.harness import coordinator
from tests.helpers import blobs, deployment, write_table
from tests.oracles.party_view import party_view
from tests.service.test_xclp_job import read_predictions
from xclp import race
from xclp.client.models import ModelFile
from xclp.flynn import FlyHash, FlyNNParams, train_counts
from xclp.graph import GraphParams
from xclp.reference import xclp_reference
from xclp.server.admin_cli import format_run
from xclp.server.config import JobConfig, TlsFiles
from xclp.server.jobs.dbcl import DbclTrainer
from xclp.simulation import run_dbcl, run_fedavg
from xclp.v1.registry import parse_params

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
DYING = Path(__file__).with_name("reveal_dying_party.py")
PARTIES = ("a", "b", "c")
C, D, N = 3, 6, 40
FLYNN = {"n_classes": C, "m": 128, "s": 3, "rho": 6, "tie_seed": 1}
TRAIN = {"n_classes": C, "hidden": [6], "rounds": 1, "batch_size": 8, "learning_rate": 0.1}
XCLP = {"n_classes": C, "lsh_bits": 64, "k": 5, "key_bits": 512, "insecure_test_keys": True}
# job id -> (type, parameters, the wire name of the sum whose reveal c dies in)
JOBS = {
    "flynn": ("flynn", FLYNN, "sum"),
    "race": ("race", {"rows": 8, "width": 16, "family": "srp", "p": 4}, "sum"),
    "moments": ("flynn", {**FLYNN, "standardise": True}, "moments"),
    "xclp": ("xclp", XCLP, "rowsums"),
    "fedavg": ("fedavg", {**TRAIN, "local_epochs": 1, "pseudo_label": "none"}, "r0.update"),
    "dbcl": ("dbcl", {**TRAIN, "optimiser": "sgd"}, "r0.update"),
}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("lost-reveal")
    allow = deployment(root, PARTIES)
    data = {p: blobs(70 + i, n=N, labeled=12, d=D) for i, p in enumerate(PARTIES)}
    for p, d in data.items():
        write_table(root / f"{p}.csv", d.X, d.y, d.ids)
    configs = [JobConfig(job_id, kind, parse_params(kind, params), PARTIES, 2, 120.0, 60.0,
                         summary_path=root / f"{job_id}.summary.json" if kind == "xclp" else None)
               for job_id, (kind, params, _) in JOBS.items()]
    round_seeds: list[bytes] = []  # DBCL's sketch seed, drawn by the coordinator
    fresh_seed = DbclTrainer.fresh_seed

    def kept_seed(self: DbclTrainer, t: int) -> bytes:
        seed = fresh_seed(self, t)
        round_seeds.append(seed)
        return seed

    DbclTrainer.fresh_seed = kept_seed  # type: ignore[method-assign]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "XCLP_TESTING": "1"}
    tls = TlsFiles(root / "certs" / "server.pem", root / "certs" / "server-key.pem")
    try:
        with coordinator(allow, configs, tls=tls) as (coord, address):
            port = address.rsplit(":", 1)[1]
            procs = {}
            for job_id, (kind, _, step) in JOBS.items():
                (root / job_id).mkdir()
                for party in PARTIES:
                    out = root / job_id / (party if kind == "xclp" else f"{party}.npz")
                    args = ["run", "--coordinator", f"localhost:{port}", "--ca-cert", str(root / "ca" / "ca.pem"),
                            "--job", job_id, "--party", party, "--identity", str(root / "keys" / f"{party}.key"),
                            "--peers", str(root / "allow.toml"), "--min-parties", "2", "--data",
                            str(root / f"{party}.csv"), "--id-column", "row_id", "--out", str(out),
                            "--debug-dump-seed", str(root / job_id / f"{party}.seed"),
                            # a sum among the rest after the moments opened among all three, and one table in
                            # every job: each the ledger would refuse (tests/threat_model/test_identities.py)
                            "--allow-rerun"]
                    if kind == "xclp":
                        args += ["--paillier-bits", "512", "--insecure-test-keys", "--workers", "0"]
                    if kind == "dbcl":  # the sums, not DBCL's DP, are under test here
                        args += ["--allow-non-dp-dbcl"]
                    cmd = ([sys.executable, str(DYING), f"{step}_reveal"] if party == "c" else
                           [sys.executable, "-m", "xclp.client.cli"]) + args
                    procs[(job_id, party)] = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, env=env)
            logs = {key: proc.communicate(timeout=300)[1] for key, proc in procs.items()}
            codes = {key: proc.returncode for key, proc in procs.items()}
            for job in coord.jobs.values():
                job.done_event.wait(30)
            yield {"root": root, "coord": coord, "data": data, "codes": codes, "logs": logs,
                   "round_seeds": round_seeds}
    finally:
        DbclTrainer.fresh_seed = fresh_seed  # type: ignore[method-assign]


def finished(run, job_id: str) -> bytes:
    """a and b finished and c was killed; the common seed they hold."""
    assert run["codes"][(job_id, "c")] == -9, run["logs"][(job_id, "c")]
    for p in "ab":
        assert run["codes"][(job_id, p)] == 0, run["logs"][(job_id, p)]
    seeds = {(run["root"] / job_id / f"{p}.seed").read_bytes() for p in "ab"}
    assert len(seeds) == 1
    job = run["coord"].jobs[job_id]
    step = JOBS[job_id][2]
    assert job.stage.value == "done" and job.ledger.recovered == [f"c in {step}"]
    if JOBS[job_id][0] == "xclp":  # the run summary file
        summary = json.loads((run["root"] / f"{job_id}.summary.json").read_text())
        assert [r for s in summary["steps"].values() for r in s.get("recovered", [])] == [f"c in {step}"]
    shown = format_run(run["coord"].run_info(job.run_id))  # what `xclp-server job show` prints
    assert f"reconstructed b for party c ({step}): lost while revealing" in shown
    return seeds.pop()


def pooled(run, parties=PARTIES) -> tuple[np.ndarray, np.ndarray]:
    return (np.vstack([run["data"][p].X for p in parties]), np.concatenate([run["data"][p].y for p in parties]))


def models(run, job_id: str) -> list[ModelFile]:
    return [ModelFile.load(run["root"] / job_id / f"{p}.npz") for p in "ab"]


def test_flynn_counts_are_the_pooled_counts_of_all_three(run) -> None:
    seed = finished(run, "flynn")
    X, y = pooled(run)
    want = train_counts(FlyHash.from_seed(seed, FlyNNParams(D, 128, 3, 6)), X[y >= 0], y[y >= 0], C)
    assert all(np.array_equal(m.aggregate, want) for m in models(run, "flynn"))


def test_race_sketch_is_the_pooled_sketch_of_all_three(run) -> None:
    seed = finished(run, "race")
    hashes = race.RaceHashes.from_seed(seed, race.RaceParams(8, 16, "srp", 4), D)
    want = race.sketch(hashes, pooled(run)[0])
    assert all(np.array_equal(m.aggregate, want) for m in models(run, "race"))


def test_moments_are_pooled_over_all_three_and_the_sum_after_runs_among_the_rest(run) -> None:
    seed = finished(run, "moments")
    X, _ = pooled(run)
    mean, std = X.mean(axis=0), X.std(axis=0)
    Xab, yab = pooled(run, "ab")
    want = train_counts(FlyHash.from_seed(seed, FlyNNParams(D, 128, 3, 6)), ((Xab - mean) / std)[yab >= 0],
                        yab[yab >= 0], C)
    for m in models(run, "moments"):
        assert m.scaling is not None
        np.testing.assert_allclose(m.scaling.mean, mean, rtol=1e-12)
        np.testing.assert_allclose(m.scaling.std, std, rtol=1e-12)
        assert np.array_equal(m.aggregate, want)


def test_xclp_labels_are_the_references_with_cs_labels_in_the_row_sums(run) -> None:
    seed = finished(run, "xclp")
    ref = xclp_reference([(run["data"][p].X, run["data"][p].y) for p in PARTIES], seed, C, 64, GraphParams(k=5))
    for j, party in enumerate("ab"):
        ids, labels, confidence, scores = read_predictions(run["root"] / "xclp" / party / "predictions.csv")
        want_labels, want_confidence, want_scores = party_view(ref.scores[ref.party_rows(j)], run["data"][party].y, C,
                                                               hide_label_mask=False)
        assert ids == list(run["data"][party].ids)
        np.testing.assert_array_equal(labels, want_labels)
        np.testing.assert_allclose(scores, want_scores, rtol=0, atol=1e-6)
        np.testing.assert_allclose(confidence, want_confidence, rtol=0, atol=1e-6)
    assert not (run["root"] / "xclp" / "c" / "predictions.csv").exists()


def test_fedavg_model_is_the_simulations_over_all_three(run) -> None:
    seed = finished(run, "fedavg")
    kind, params, _ = JOBS["fedavg"]
    sim = run_fedavg({p: (d.X, d.y) for p, d in run["data"].items()}, parse_params(kind, params), seed=seed)
    for m in models(run, "fedavg"):
        np.testing.assert_allclose(m.aggregate, sim.model.flat, rtol=0, atol=4 * 3 * 2.0 ** -24)
    assert run["coord"].jobs["fedavg"].job.history[0]["parties"] == ["a", "b", "c"]


def test_dbcl_model_is_the_simulations_over_all_three(run) -> None:
    seed = finished(run, "dbcl")
    kind, params, _ = JOBS["dbcl"]
    sim = run_dbcl({p: (d.X, d.y) for p, d in run["data"].items()}, parse_params(kind, params), seed=seed,
                   round_seeds=run["round_seeds"])
    for m in models(run, "dbcl"):
        np.testing.assert_allclose(m.aggregate, sim.model.flat, rtol=0, atol=0.1 * 5 * 3 * 2.0 ** -24)
    assert run["coord"].jobs["dbcl"].job.history[0]["parties"] == ["a", "b", "c"]
