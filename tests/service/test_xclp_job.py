"""XCLP over the service (docs/design.md §5): real party processes over localhost TLS, checked against the oracle.

One coordinator (in this process, so the test can read what it learned: its H and, through the
observer hook, every SecureRowSums payload it received) serves three XCLP jobs at once; every
party is a real `xclp-client run` process (512-bit test keys, L = 64, 3 × 40 rows):

- "exact":   all three finish; H and predictions are checked against `xclp_reference`;
- "kill-sh": party c kills itself mid-SecureHamming: H and the labels of a and b are those of a
             run without c (docs/design.md §5: "its rows and columns are removed");
- "kill-rs": party b (hide_label_mask, per-party label normalisation) kills itself in SecureRowSums:
             it stays in H but brings and gets no labels; the step restarts under fresh masks;
- "push":    the influence columns pushed to a tolerance and sent sparse (docs/design.md §10.7).

The common seed reaches the test only through the party's `--debug-dump-seed` test hook, which
the client refuses unless XCLP_TESTING=1 (checked below).
"""

from __future__ import annotations

import csv
import json
import math
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from tests.harness import Recorder, admit, coordinator
from tests.helpers import deployment, write_table
from tests.oracles.party_view import party_view
from xclp.crypto import identity
from xclp.crypto.fixedpoint import FixedPoint
from xclp.data.party_table import PartyData
from xclp.errors import ConfigError, InvalidInput
from xclp.graph import GraphParams
from xclp.reference import XclpResult, xclp_reference
from xclp.server.config import JobConfig, TlsFiles, load_job
from xclp.v1.status import EXIT_BAD_INPUT
from xclp.v1.xclp import XclpJobParams

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
DYING = Path(__file__).with_name("xclp_dying_party.py")
PARTIES = ("a", "b", "c")
L, C, D, N, K = 64, 3, 8, 40, 5
PARAMS = {"n_classes": C, "lsh_bits": L, "k": K, "key_bits": 512, "insecure_test_keys": True}
JOBS = {
    "exact": {},
    "kill-sh": {},
    "kill-rs": {"hide_label_mask": True, "label_norm": "party"},
    "cg": {"solver": "cg"},  # conjugate gradients on the coordinator instead of dense Cholesky
    "lu": {"solver": "sparse"},  # a sparse LU (what "auto" picks above 3 000 rows)
    "big-k": {"k": 3 * N},  # more neighbours than rows: refused before any work
    "push": {"influence_tolerance": 1e-3},  # sparse influence columns (docs/design.md §10.7)
}
DIES = {"kill-sh": ("c", "secure_hamming"), "kill-rs": ("b", "rowsums")}


def make_data(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Three Gaussian classes in 8-D; about a third of the rows labeled (row 0 always)."""
    rng = np.random.default_rng(seed)
    centres = np.random.default_rng(0).normal(scale=3.0, size=(C, D))
    y = rng.integers(0, C, size=N)
    X = centres[y] + rng.normal(size=(N, D))
    seen = np.where(rng.random(N) < 0.35, y, -1)
    seen[0] = y[0]
    return X, seen


def read_predictions(path: Path) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray]:
    """A party's predictions.csv: ids, labels int[n], confidences float[n], scores float[n, C]."""
    ids, labels, confidence, scores = read_predictions_any(path)
    return ids, np.array(labels), np.array(confidence), np.array(scores)


def read_predictions_any(path: Path) -> tuple[list[str], list[int], list[float], list[list[float]]]:
    with open(path, newline="") as fh:
        rows = list(csv.DictReader(fh))
    n_classes = sum(k.startswith("score_") for k in rows[0])
    ident = next(iter(rows[0]))  # the id column, first, under the name the party's table gave it
    return ([r[ident] for r in rows], [int(r["label"]) for r in rows], [float(r["confidence"]) for r in rows],
            [[float(r[f"score_{c}"]) for c in range(n_classes)] for r in rows])


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("xclp")
    allow = deployment(root, PARTIES)
    data = {p: make_data(i) for i, p in enumerate(PARTIES)}
    for p, (X, y) in data.items():
        write_table(root / f"{p}.csv", X, y, [f"{p}-{i}" for i in range(len(y))])
    configs = [JobConfig(job_id, "xclp", XclpJobParams.parse({**PARAMS, **extra}), PARTIES, 2, 120.0, 60.0,
                         summary_path=root / f"{job_id}.summary.json") for job_id, extra in JOBS.items()]
    recorder = Recorder()
    tls = TlsFiles(root / "certs" / "server.pem", root / "certs" / "server-key.pem")
    go = root / "kill-rs.go"  # the dying party of kill-rs dies once a and c have pushed round 0
    env = {**os.environ, "PYTHONPATH": str(ROOT), "XCLP_TESTING": "1", "XCLP_TEST_GO_FILE": str(go)}
    threading.Thread(target=lambda: (recorder.wait_for(("kill-rs", "rowsums", 0, "a"), ("kill-rs", "rowsums", 0, "c"),
                                                       timeout=240), go.touch()), daemon=True).start()
    with coordinator(allow, configs, observer=recorder, tls=tls) as (coord, address):
        port = address.rsplit(":", 1)[1]
        procs = {}
        for job_id in JOBS:
            for i, party in enumerate(PARTIES):
                args = ["run", "--coordinator", f"localhost:{port}", "--ca-cert", str(root / "ca" / "ca.pem"),
                        "--job", job_id, "--party", party, "--identity", str(root / "keys" / f"{party}.key"),
                        "--peers", str(root / "allow.toml"), "--min-parties", "2", "--allow-hide-label-mask",
                        # every job reads the same tables, at once, and some end among fewer parties:
                        # the ledger would keep each among one set (tests/threat_model/test_identities.py)
                        "--allow-rerun",
                        "--data", str(root / f"{party}.csv"), "--id-column", "row_id", "--paillier-bits", "512",
                        "--insecure-test-keys", "--out", str(root / job_id / party),
                        "--debug-dump-seed", str(root / job_id / f"{party}.seed"),
                        # one party of the exact job runs its Paillier work on a process pool
                        "--workers", "2" if (job_id, i) == ("exact", 0) else "0"]
                if DIES.get(job_id, ("",))[0] == party:
                    cmd = [sys.executable, str(DYING), DIES[job_id][1], *args]
                else:
                    cmd = [sys.executable, "-m", "xclp.client.cli", *args]
                procs[(job_id, party)] = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, env=env)
        logs = {key: proc.communicate(timeout=240)[1] for key, proc in procs.items()}
        codes = {key: proc.returncode for key, proc in procs.items()}
        for job in coord.jobs.values():
            job.done_event.wait(30)
        yield {"root": root, "coord": coord, "data": data, "codes": codes, "logs": logs, "recorder": recorder}


def seed_of(run, job_id: str) -> bytes:
    seeds = {(run["root"] / job_id / f"{p}.seed").read_bytes()
             for p in PARTIES if (run["root"] / job_id / f"{p}.seed").exists()}
    assert len(seeds) == 1, "every party that finished holds the same common seed"
    return seeds.pop()


def reference(run, job_id: str, ids=PARTIES, unlabeled=(), normalise="none") -> XclpResult:
    parties = [(run["data"][p][0], np.full(N, -1) if p in unlabeled else run["data"][p][1]) for p in ids]
    return xclp_reference(parties, seed_of(run, job_id), C, L, GraphParams(k=K), normalise_labels=normalise,
                          influence_tolerance=JOBS[job_id].get("influence_tolerance", 0.0))


def assert_predictions(run, job_id: str, ref: XclpResult, ids, receivers) -> None:
    """Each receiver's predictions.csv: the reference on its unlabeled rows, its own labels elsewhere
    (all rows from the reference under hide_label_mask), with its own row ids in order."""
    hide = JOBS[job_id].get("hide_label_mask", False)
    for j, party in enumerate(ids):
        if party not in receivers:
            continue
        assert run["codes"][(job_id, party)] == 0, run["logs"][(job_id, party)]
        path = run["root"] / job_id / party / "predictions.csv"
        assert path.stat().st_mode & 0o777 == 0o600  # the party's own data: readable by it alone
        got_ids, labels, confidence, scores = read_predictions(path)
        want_labels, want_confidence, want_scores = party_view(ref.scores[ref.party_rows(j)], run["data"][party][1], C,
                                                               hide_label_mask=hide)
        assert got_ids == [f"{party}-{i}" for i in range(N)]  # the party's own row ids, in order
        np.testing.assert_array_equal(labels, want_labels)
        np.testing.assert_allclose(scores, want_scores, rtol=0, atol=1e-6)  # fixed point 2^-32 per term
        np.testing.assert_allclose(confidence, want_confidence, rtol=0, atol=1e-6)


# ---- correctness contract (docs/design.md §5) ------------------------------------------------------------


def assert_same_graph(W, ref) -> None:
    np.testing.assert_array_equal(W.indptr, ref.indptr)
    np.testing.assert_array_equal(W.indices, ref.indices)
    np.testing.assert_array_equal(W.data, ref.data)  # bit for bit


def test_coordinator_graph_equals_the_plaintext_graph_and_it_never_held_H(run) -> None:
    """docs/design.md §10.1: the graph folded from own nearest rows and cross blocks as they arrived is the
    reference's graph on the whole H; what the coordinator keeps is n·k candidates, not H."""
    state = run["coord"].jobs["exact"].job.xclp
    assert_same_graph(state.W, reference(run, "exact").influence.W)
    assert state.graph_layout.parties == PARTIES
    assert not any(isinstance(v, np.ndarray) and v.shape == (3 * N, 3 * N) for v in vars(state).values())


def test_every_party_predicts_what_the_plaintext_reference_predicts(run) -> None:
    ref = reference(run, "exact")
    assert len(np.unique(ref.labels)) == C  # not a degenerate answer
    assert_predictions(run, "exact", ref, PARTIES, PARTIES)


def test_sparse_influence_through_the_service_equals_the_reference_pushed_alike(run) -> None:
    """docs/design.md §10.7: with influence_tolerance the coordinator pushes each column and sends it
    sparse; every party's predictions are the reference's with the same push (not the exact ones),
    the summary and each party say what the push left out, and the columns cost fewer bytes."""
    ref, exact = reference(run, "push"), reference(run, "exact")
    assert not np.allclose(ref.scores, xclp_reference(
        [run["data"][p] for p in PARTIES], seed_of(run, "push"), C, L, GraphParams(k=K)).scores)
    assert_predictions(run, "push", ref, PARTIES, PARTIES)
    summary = json.loads((run["root"] / "push.summary.json").read_text())
    solve = summary["influence"]
    labeled = sum(int((run["data"][p][1] >= 0).sum()) for p in PARTIES)
    assert (solve["method"], solve["columns"], solve["tolerance"]) == ("push", labeled, 1e-3)
    assert 0 < solve["dropped_max"] < 1 and 0 < solve["dropped_mean"] <= solve["dropped_max"]
    assert 0 < solve["nonzeros"] < labeled * 3 * N and summary["params"]["influence_tolerance"] == 1e-3
    dense = json.loads((run["root"] / "exact.summary.json").read_text())
    # fewer bytes, not a set share: on a graph this small the push keeps about half of each column, and how
    # many entries depends on the run's common seed (a CI run sent 21 524 bytes against the exact 40 320);
    # at scale the share is small (docs/jobs/xclp.md "Sparse influence": 32 MB against 2.3 GB)
    assert summary["steps"]["influence"]["bytes_out"] < dense["steps"]["influence"]["bytes_out"]
    for p in PARTIES:  # each party's own account of the bound, from the pieces it received
        assert "influence columns pushed to tolerance 0.001: each class of Z̄ keeps at least" in \
            run["logs"][("push", p)]
    assert exact.scores.shape == ref.scores.shape


def test_run_summary_has_step_durations_and_bytes(run) -> None:
    summary = json.loads((run["root"] / "exact.summary.json").read_text())
    assert summary["outcome"] == "done" and summary["graph_parties"] == list(PARTIES)
    labeled = sum(int((run["data"][p][1] >= 0).sum()) for p in PARTIES)
    solve = summary["influence"]  # docs/design.md §10.2: solved in blocks of columns, the residual reported
    assert (solve["method"], solve["columns"], solve["blocks"]) == ("dense", labeled, 3)
    assert solve["max_relative_residual"] <= 1e-6
    cg = json.loads((run["root"] / "cg.summary.json").read_text())["influence"]
    assert cg["method"] == "cg" and cg["iterations"] > 10 and cg["max_relative_residual"] <= 1e-6
    for step in ("intra_hamming", "secure_hamming", "labeled_sets", "graph", "rowsums"):
        assert summary["steps"][step]["seconds"] > 0, step
    ct = 2 * 512 // 8
    slots = (512 - 2) // math.ceil(math.log2(L + 1))  # K = ⌊(|N| − 2)/w⌋, w = ⌈log2(L+1)⌉ (crypto/secure_hamming.py)
    batches = math.ceil(N / slots)
    # three pairs of one piece each (xclp.v1.secure_hamming_wire): the slices (a 20-byte header and one
    # ciphertext per (batch, bit)) and the piece (one per (batch, B row)), each relay framed (5 bytes) and
    # sealed end to end (AES-GCM: 12-byte nonce and 16-byte tag, docs/design.md §2.2); no acknowledgement
    relayed = 3 * (5 + 20 + batches * L * ct) + 3 * (5 + batches * N * ct) + 6 * (12 + 16)
    assert summary["steps"]["secure_hamming"]["bytes_relayed"] == relayed
    # per pair B's mask seed and A's t, one 512-bit value per ciphertext D, each upload with a 16-byte header;
    # never the masks R themselves (B's seed stands for them)
    assert summary["steps"]["secure_hamming"]["bytes_in"] == 3 * (16 + 32) + 3 * (16 + batches * N * 512 // 8)
    assert summary["bytes_total"] == sum(s["bytes_in"] + s["bytes_relayed"] + s["bytes_out"]
                                         for s in summary["steps"].values())


# ---- dropouts (docs/design.md §5, end) -------------------------------------------------------------------


def test_conjugate_gradient_solver_gives_the_reference_predictions_through_the_service(run) -> None:
    job = run["coord"].jobs["cg"]
    assert job.config.params.solver == "cg" and job.stage.value == "done"
    ref = reference(run, "cg")  # the reference solves densely: CG must agree within the same 1e-6
    assert_predictions(run, "cg", ref, PARTIES, PARTIES)


def test_the_sparse_lu_solver_gives_the_reference_predictions_through_the_service(run) -> None:
    job = run["coord"].jobs["lu"]
    assert job.config.params.solver == "sparse" and job.stage.value == "done"
    solve = json.loads((run["root"] / "lu.summary.json").read_text())["influence"]
    assert solve["method"] == "sparse" and solve["iterations"] == 0 and solve["max_relative_residual"] <= 1e-12
    assert 1.0 <= solve["fill"] <= 1000 and solve["factor_seconds"] >= 0
    assert_predictions(run, "lu", reference(run, "lu"), PARTIES, PARTIES)


def test_party_killed_in_secure_hamming_leaves_H_and_the_others_finish_without_it(run) -> None:
    assert run["codes"][("kill-sh", "c")] == -9
    assert "SecureHamming attempt 0" in run["logs"][("kill-sh", "c")]
    job = run["coord"].jobs["kill-sh"]
    ref = reference(run, "kill-sh", ids=("a", "b"))
    assert_same_graph(job.job.xclp.W, ref.influence.W)  # c's rows are gone
    assert job.job.xclp.membership.graph == ("a", "b") and job.ledger["secure_hamming"].rounds == 2
    assert_predictions(run, "kill-sh", ref, ("a", "b"), ("a", "b"))


def test_party_killed_in_rowsums_shapes_the_graph_but_brings_and_gets_no_labels(run) -> None:
    assert run["codes"][("kill-rs", "b")] == -9
    job = run["coord"].jobs["kill-rs"]
    # the job hides the label mask: the coordinator did not even learn how many rows are labeled
    assert all(party.summary.labeled_rows == 0 for party in job.parties.values())
    assert_same_graph(job.job.xclp.W, reference(run, "kill-rs").influence.W)  # b's rows stay in the graph
    ref = reference(run, "kill-rs", unlabeled=("b",), normalise="party")
    assert_predictions(run, "kill-rs", ref, PARTIES, ("a", "c"))
    assert not (run["root"] / "kill-rs" / "b" / "predictions.csv").exists()
    with_b = reference(run, "kill-rs", normalise="party")
    assert not np.allclose(ref.scores, with_b.scores)  # b's labels would have mattered


def test_rowsums_payloads_look_uniform_and_the_restart_uses_fresh_masks(run) -> None:
    seen = {(rnd, sender): np.asarray(p) for (job, step, rnd, sender), p in run["recorder"].seen.items()
            if job == "kill-rs" and step == "rowsums"}
    assert set(seen) == {(0, "a"), (0, "c"), (1, "a"), (1, "c")}  # b never pushed; round 1 is the restart
    words = np.concatenate([p.reshape(-1) for p in seen.values()])
    assert words.dtype == np.uint64 and words.size == 2 * (2 * N * C) + 2 * (N * C)
    counts = np.bincount(words.view(np.uint8), minlength=256)
    # fresh masks each run: α = 1e-6 (at 1e-3 a correct run fails about once in 500)
    assert stats.chisquare(counts).pvalue > 1e-6
    ones = ((words[:, None] >> np.arange(64, dtype=np.uint64)) & np.uint64(1)).sum(axis=0)
    z = (ones - words.size / 2) / math.sqrt(words.size / 4)
    assert np.abs(z).max() < stats.norm.isf(1e-6 / 128)  # every bit a fair coin (Bonferroni)
    # the same encoded scores underneath in both rounds (a's view of c's rows): only fresh masks differ
    assert np.count_nonzero(seen[(0, "a")][N:] == seen[(1, "a")]) == 0
    # and the check has teeth: unmasked fixed-point scores are nowhere near uniform
    plain = FixedPoint().encode(np.random.default_rng(1).random((2 * N, C)), n_terms=3).reshape(-1).view(np.uint8)
    assert stats.chisquare(np.bincount(plain, minlength=256)).pvalue < 1e-6


# ---- refusals ------------------------------------------------------------------------------------


def test_debug_seed_hook_is_refused_without_the_testing_flag(run, tmp_path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "XCLP_TESTING"}
    out = subprocess.run([sys.executable, "-m", "xclp.client.cli", "run", "--coordinator", "localhost:1",
                          "--job", "exact",
                          "--party", "a", "--identity", str(run["root"] / "keys" / "a.key"),
                          "--peers", str(run["root"] / "allow.toml"),
                          "--data", str(run["root"] / "a.csv"), "--out", str(tmp_path),
                          "--debug-dump-seed", str(tmp_path / "seed")],
                         capture_output=True, text=True, env={**env, "PYTHONPATH": str(ROOT)}, timeout=120)
    assert out.returncode == EXIT_BAD_INPUT
    assert "XCLP_TESTING=1" in out.stderr and not (tmp_path / "seed").exists()


def test_debug_dump_on_the_coordinator_is_refused_without_the_testing_flag(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv("XCLP_TESTING", raising=False)
    path = tmp_path / "job.toml"
    path.write_text('job_id = "x"\ntype = "xclp"\nexpected_parties = ["a", "b"]\ndebug_dump = "dump"\n'
                    "[params]\nn_classes = 3\n")
    with pytest.raises(ConfigError, match="XCLP_TESTING=1"):
        load_job(path)
    monkeypatch.setenv("XCLP_TESTING", "1")
    assert load_job(path).debug_dump_dir == tmp_path / "dump"


def test_a_k_larger_than_the_rows_is_refused_before_any_work_with_the_input_exit_code(run) -> None:
    for party in PARTIES:
        log = run["logs"][("big-k", party)]
        assert run["codes"][("big-k", party)] == EXIT_BAD_INPUT, log
        assert f"k = {3 * N} neighbours need at least {3 * N + 1} rows in all" in log and "lower k" in log
        assert "LSH" not in log and "SecureHamming" not in log  # nothing was computed
    assert run["coord"].jobs["big-k"].step is None and run["coord"].jobs["big-k"].ledger.steps == {}


def test_party_without_a_paillier_key_is_refused_with_the_flag_to_use(run) -> None:
    from xclp.server import admission

    job = run["coord"].jobs["exact"]
    bundle = identity.KeyBundle("a", "exact", bytes(32), bytes(32), bytes(16))
    with pytest.raises(InvalidInput, match="--paillier-bits 512"):  # checked before the signature
        admission.check_bundle(job.config, job.allow_list, job.run_nonce,
                               identity.SignedBundle(bundle.canonical_bytes(), bytes(64)))


def test_demo_job_file_loads() -> None:
    config = load_job(ROOT / "xclp" / "demo_data" / "xclp-demo.toml")
    assert config.params == XclpJobParams(n_classes=10, k=5, power=3.0, label_norm="none")
    assert config.expected_parties == ("hospital-a", "hospital-b", "hospital-c")


def test_job_file_naming_sigma_is_refused() -> None:
    """SecureHamming masks are uniform mod N now: there is no σ to set, and a stale job file says so."""
    with pytest.raises(ConfigError, match="unknown xclp job parameter.*sigma"):
        XclpJobParams.parse({"n_classes": 2, "sigma": 40})


# ---- the coordinator's state machine without sockets ---------------------------------------------


class AtSecureHamming:
    """A Run (no sockets) of an XCLP job among `parties` with 3 rows each, past the seed and the
    intra step: its SecureHamming step is on (among a, b and c, with the pairs (b, a), (a, c), (c, b))."""

    def __init__(self, parties: tuple[str, ...] = PARTIES, step_seconds: float = 30.0) -> None:
        from tests.harness import job as job_config
        from xclp.server.run import Run
        from xclp.v1 import xclp_pb2 as pb

        keys = {p: identity.generate_identity() for p in parties}
        self.now = 0.0
        self.run = j = Run(job_config("j", "xclp", PARAMS, parties=parties, step_seconds=step_seconds),
                           {p: identity.public_bytes(k) for p, k in keys.items()}, clock=lambda: self.now)
        for p in parties:
            admit(j, keys, p, pb.DataSummary(rows=3, labeled_rows=1, dim=D),
                  paillier_n=b"\x80" + bytes(62) + b"\x01", paillier_hs=bytes(127) + b"\x02")
        for p in parties:
            self.send(p, "seed", b"")
        for p in parties:
            self.send(p, "intra_hamming", np.array([[[1, 0], [2, 0]], [[0, 0], [2, 0]], [[0, 0], [1, 0]]], np.uint32))
        assert j.step.name == "secure_hamming"
        if parties == PARTIES:
            assert [(t.a, t.b) for t in j.job.xclp.pairs] == [("b", "a"), ("a", "c"), ("c", "b")]

    def send(self, sender: str, step: str, payload, recipient: str = "") -> None:
        from xclp.v1 import wire

        self.run.message(sender, wire.Message("j", step, self.run.step.attempt, sender, recipient, payload))

    def upload(self, sender: str, kind, pair: int, data: bytes, piece: int = 0) -> None:
        from xclp.v1.secure_hamming_wire import HammingUpload

        self.send(sender, "secure_hamming", HammingUpload(kind, pair, piece, data).to_array())


def test_secure_hamming_deadline_blames_the_silent_party_not_those_waiting_for_it() -> None:
    from xclp.v1.secure_hamming_wire import Upload

    at = AtSecureHamming()
    j, send, upload = at.run, at.send, at.upload
    upload("a", Upload.SEED, 0, bytes(32))  # pair 0 (b, a): a is B, its mask seed ...
    send("b", "secure_hamming", b"slices", recipient="a")  # ... b encrypts, a evaluates (one piece) ...
    send("a", "secure_hamming", b"evaluated", recipient="b")
    upload("b", Upload.T, 0, bytes(3 * 64))  # ... b decrypts: t of 1 batch x 3 rows, done
    with pytest.raises(InvalidInput, match="piece 0 of pair \\(b, a\\) where piece 1 of 1 was due"):
        upload("b", Upload.T, 0, bytes(3 * 64))
    with pytest.raises(InvalidInput, match="only B \\('a'\\) sends the mask seed"):
        upload("b", Upload.SEED, 0, bytes(32))
    upload("b", Upload.SEED, 2, bytes(32))  # pair 2 (c, b): b's seed, then it waits for c's slices
    send("a", "secure_hamming", b"slices", recipient="c")  # pair (a, c): c never evaluates ...
    with pytest.raises(InvalidInput, match="already sent"):
        send("a", "secure_hamming", b"again", recipient="c")
    with pytest.raises(InvalidInput, match="not a SecureHamming pair"):
        send("a", "secure_hamming", b"x", recipient="a")
    # ... nor encrypts for (c, b): a and b wait for c, so only c is to blame
    assert j.phase.blame(j.step) == {"c"}
    at.now = j.step.started + j.config.step_seconds + 1  # c silent for a step_seconds (a and b wait)
    j.tick(at.now)
    assert j.dropped == {"c"} and j.job.xclp.membership.graph == ("a", "b")
    assert (j.step.name, j.step.attempt, j.step.participants) == ("secure_hamming", 1, ("a", "b"))


def test_malformed_secure_hamming_uploads_are_refused_and_the_step_goes_on() -> None:
    """What a broken or hostile party may push in place of a seed or t: each refused with what is
    wrong, none counted, and the pair then completes with the right messages."""
    import struct

    from xclp.v1.secure_hamming_wire import Upload

    at = AtSecureHamming()
    head = struct.Struct(">4sBxxxII")  # magic, kind, pair, piece (xclp.v1.secure_hamming_wire)

    def raw(data: bytes) -> np.ndarray:
        return np.frombuffer(data, dtype=np.uint8).copy()

    for payload, refusal in [
        (np.zeros(40, dtype=np.uint16), "must be uint8\\[16 \\+ data\\]"),  # not bytes
        (raw(b"short"), "must be uint8\\[16 \\+ data\\]"),  # shorter than the header
        (raw(head.pack(b"XXXX", 1, 0, 0) + bytes(32)), "unknown header"),  # not a SecureHamming upload
        (raw(head.pack(b"XSH1", 9, 0, 0) + bytes(32)), "unknown header"),  # no such kind
        (raw(head.pack(b"XSH1", 1, 0, 0) + bytes(31)), "carries 32 bytes and piece 0"),  # a short seed
        (raw(head.pack(b"XSH1", 1, 7, 0) + bytes(32)), "pair 7 is not a SecureHamming pair"),
    ]:
        with pytest.raises(InvalidInput, match=refusal):
            at.send("a", "secure_hamming", payload)
    with pytest.raises(InvalidInput, match="t of pair \\(b, a\\) before B's mask seed"):
        at.upload("b", Upload.T, 0, bytes(3 * 64))
    at.upload("a", Upload.SEED, 0, bytes(32))
    at.send("b", "secure_hamming", b"slices", recipient="a")
    at.send("a", "secure_hamming", b"evaluated", recipient="b")
    for data in (bytes(3 * 64 - 1), bytes(3 * 64 + 64)):  # t of 3 values of 64 bytes, or nothing
        with pytest.raises(InvalidInput, match="t of piece 0 of pair \\(b, a\\) must be 3 values of 64 bytes"):
            at.upload("b", Upload.T, 0, data)
    with pytest.raises(InvalidInput, match="piece 1 of pair \\(b, a\\) where piece 0 of 1 was due"):
        at.upload("b", Upload.T, 0, bytes(3 * 64), piece=1)
    at.upload("b", Upload.T, 0, bytes(3 * 64))  # one of the right size still counts: the pair is done
    assert at.run.phase.streams[0].folded == 1 and at.run.step.name == "secure_hamming"
    assert "malformed" in at.run.phase.errors[0]  # (zeros are no t: the values fail the step once it is over)


def test_a_party_that_stops_reading_its_influence_columns_is_sent_no_more(monkeypatch) -> None:
    """docs/design.md §10.2: the next influence block is solved while the last one is on its way to its
    owner and queued once that one has left. A party that stops reading (here b; a and c read) is
    waited for once, a step's deadline, and then the block solved meanwhile is dropped and the rest
    of its columns are neither solved nor queued: the coordinator holds at most one block queued for
    it and one in hand, never all of its S_L (it used to solve and queue every one)."""
    import scipy.sparse as sp

    import xclp.server.jobs.xclp as coordinator_xclp
    from xclp.graph import InfluenceSolver
    from xclp.server.steps.xclp import RowLayout

    monkeypatch.setattr(coordinator_xclp, "solve_columns", lambda n: 1)  # blocks of one column
    monkeypatch.setattr(coordinator_xclp.steps, "INFLUENCE_BACKLOG_BYTES", 0)
    solved: list[int] = []
    real_solve = InfluenceSolver.solve
    monkeypatch.setattr(InfluenceSolver, "solve", lambda self, cols: (solved.extend(cols), real_solve(self, cols))[1])
    at = AtSecureHamming(step_seconds=0.3)
    state, scope = at.run.job.xclp, at.run.phase.scope
    state.graph_layout = RowLayout(PARTIES, (3, 3, 3))
    ring = np.roll(np.eye(9), 1, axis=1)
    state.W = sp.csr_matrix(ring + ring.T)
    state.labeled = {p: np.arange(3) for p in PARTIES}  # three columns for each party
    mailboxes = {p: at.run.parties[p].mailbox for p in PARTIES}
    for p in PARTIES:  # what the SecureHamming step left
        while mailboxes[p].get(timeout=0) is not None:
            pass
    stop = threading.Event()

    def read(p: str) -> None:
        while not stop.is_set():
            mailboxes[p].get(timeout=0.01)

    readers = [threading.Thread(target=read, args=(p,), daemon=True) for p in ("a", "c")]
    for r in readers:
        r.start()
    distribute = coordinator_xclp.Distribute(scope, state)
    monkeypatch.setattr(at.run, "phase", distribute)  # the run's phase now, as the program makes it
    try:
        distribute.work()  # here on the test's thread (the run gives it one of its own)
    finally:
        stop.set()
    assert solved == [0, 1, 2, 3, 4, 6, 7, 8]  # a's three columns, b's first two (the second never sent), c's three
    graph, block = 8 * 3, 8 * 9  # the graph message (uint64[3]) and one float64[9, 1] column
    assert mailboxes["b"].queued_bytes == graph + block


def test_b_cannot_flood_a_through_the_coordinator_past_its_window(monkeypatch) -> None:
    """A hostile B sends pieces without waiting for A's acknowledgements: the coordinator keeps at
    most MAX_IN_FLIGHT of them unacknowledged for A (here 2 of a pair of 3 pieces) and refuses the rest."""
    import xclp.server.phases.secure_hamming as coordinator_hamming
    import xclp.v1.secure_hamming_wire as shw
    from xclp.errors import ResourceExhausted
    from xclp.v1.secure_hamming_wire import Upload

    monkeypatch.setattr(shw, "PIECE_BYTES", 64)  # a piece per row of B (one ciphertext): 3 per pair
    monkeypatch.setattr(coordinator_hamming, "MAX_IN_FLIGHT", 2)
    at = AtSecureHamming()
    assert len(at.run.phase.streams[0].pieces) == 3
    at.upload("a", Upload.SEED, 0, bytes(32))  # pair (b, a): a is B
    at.send("b", "secure_hamming", b"slices", recipient="a")
    at.send("a", "secure_hamming", b"piece 0", recipient="b")
    at.send("a", "secure_hamming", b"piece 1", recipient="b")
    with pytest.raises(ResourceExhausted, match="'a' already sent its 'secure_hamming' 2 messages to 'b'"):
        at.send("a", "secure_hamming", b"piece 2", recipient="b")
    assert at.run.step.relays[("a", "b")] == 2  # the refused piece was not passed on
    at.upload("b", Upload.T, 0, bytes(64))
    at.send("b", "secure_hamming", b"ack 0", recipient="a")  # A acknowledged piece 0: one more may go
    at.send("a", "secure_hamming", b"piece 2", recipient="b")
    with pytest.raises(ResourceExhausted):  # and no more than the pair has
        at.send("a", "secure_hamming", b"piece 3", recipient="b")


def test_a_sends_its_slices_to_one_b_at_a_time_and_is_not_blamed_for_the_next(monkeypatch) -> None:
    """docs/design.md §10.1: A's slices wait in the coordinator's mailboxes for one B at a time. A party
    that is A of two pairs may not relay its slices to the second B before the first answered with
    a piece (what a party that ignores the rule would do, doubling the coordinator's memory), and
    while it waits it is not the one a deadline blames for the second pair."""
    from xclp.errors import ResourceExhausted
    from xclp.v1.secure_hamming_wire import Upload

    at = AtSecureHamming(("a", "b", "c", "d"))
    pairs = at.run.job.xclp.pairs
    a = next(p for p in "abcd" if sum(t.a == p for t in pairs) == 2)
    first, second = [t.b for t in pairs if t.a == a]
    for i, t in enumerate(pairs):  # every B's seed: only relays are owed
        at.upload(t.b, Upload.SEED, i, bytes(32))
    at.send(a, "secure_hamming", b"slices", recipient=first)
    with pytest.raises(ResourceExhausted, match=f"'{a}' sent its slices to '{second}' before '{first}' answered"):
        at.send(a, "secure_hamming", b"slices", recipient=second)
    assert at.run.step.relays[(a, second)] == 0
    assert a not in at.run.phase.blame(at.run.step) and first in at.run.phase.blame(at.run.step)
    at.send(first, "secure_hamming", b"piece 0", recipient=a)  # the first B answered: the second's turn
    at.send(a, "secure_hamming", b"slices", recipient=second)
    assert at.run.step.relays[(a, second)] == 1


def test_demo_command_runs_end_to_end_and_reports_accuracy(tmp_path) -> None:
    out = subprocess.run([sys.executable, "-m", "xclp.client.cli", "demo", "--key-bits", "512", "--insecure-test-keys",
                          "--lsh-bits", "256", "--keep", str(tmp_path)], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [line.split() for line in out.stdout.splitlines() if line.startswith("hospital-")]
    assert [r[0] for r in rows] == ["hospital-a", "hospital-b", "hospital-c"]
    for _, unlabeled, together, alone in rows:
        assert int(unlabeled) == 450 and 0.0 <= float(together) <= 1.0 and 0.0 <= float(alone) <= 1.0
    for party in ("hospital-a", "hospital-b", "hospital-c"):  # accuracy at demo size: benchmarks/xclp_e2e.py
        ids, labels, _, _ = read_predictions_any(tmp_path / "out" / party / "predictions.csv")
        assert len(ids) == 500 and ids[0] == f"{party}-0000" and set(labels) <= set(range(10))
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["outcome"] == "done" and summary["label_parties"] == ["hospital-a", "hospital-b", "hospital-c"]
    assert "true_label" not in (ROOT / "xclp" / "demo_data" / "hospital-a.csv").read_text().splitlines()[0]


def test_a_party_lost_before_the_first_xclp_step_leaves_a_layout_over_the_whole_roster(keys):
    """The roster (and every party's layout of it) keeps a party that joined and then left in the
    seed step; the layout and the pairs table must be laid out over that roster, with 0 rows for it."""
    from tests.harness import allow_list, job, run_parties
    from xclp.client.policy import PartyPolicy
    from xclp.client.run_config import JobResult
    from xclp.client.session import PartySession
    from xclp.crypto.paillier import PaillierKeypair

    class DiesInSeed(PartySession):
        def on_step(self, step):
            if step.step == "seed":
                raise KeyboardInterrupt("killed in the seed step")
            super().on_step(step)

    rng = np.random.default_rng(5)
    datas = {}
    for p in PARTIES:
        y = rng.integers(0, C, 20)
        y[10:] = -1
        datas[p] = PartyData(rng.normal(size=(20, D)) + y[:, None], y, tuple(f"{p}{k}" for k in range(20)))
    paillier = {p: PaillierKeypair.generate(512, allow_insecure_test_size=True) for p in PARTIES}
    with coordinator(allow_list(keys), [job("early", "xclp", PARAMS)]) as (_, address):
        results = run_parties(address, "early", keys, datas, sessions={"c": DiesInSeed}, paillier=paillier,
                              policy=PartyPolicy(min_parties=2, insecure_test_keys=True))
    assert isinstance(results["c"], KeyboardInterrupt)
    for p in ("a", "b"):
        assert isinstance(results[p], JobResult), results[p]
        assert results[p].participants == ("a", "b") and results[p].aggregate.shape == (20, C)


def test_a_party_without_labeled_rows_gets_every_row_labelled_by_the_others(keys):
    """A party with no labeled row has no influence columns: the coordinator sends it one empty
    piece, which completes its Z̄ = 0 (it refused that piece as "more influence columns than this
    party has", and the others then failed on its loss). It gets the reference's scores."""
    from tests.harness import allow_list, job, run_parties
    from xclp.client.policy import PartyPolicy
    from xclp.client.run_config import JobResult
    from xclp.crypto.paillier import PaillierKeypair

    rng = np.random.default_rng(9)
    datas = {}
    for p in PARTIES:
        y = rng.integers(0, C, 20)
        y[10 if p != "b" else 0 :] = -1  # b: no labeled row
        datas[p] = PartyData(rng.normal(size=(20, D)) + y[:, None], y, tuple(f"{p}{k}" for k in range(20)))
    paillier = {p: PaillierKeypair.generate(512, allow_insecure_test_size=True) for p in PARTIES}
    with coordinator(allow_list(keys), [job("nolabels", "xclp", PARAMS)]) as (_, address):
        results = run_parties(address, "nolabels", keys, datas, paillier=paillier,
                              policy=PartyPolicy(min_parties=2, insecure_test_keys=True))
    assert all(isinstance(r, JobResult) for r in results.values()), results
    b = results["b"]
    assert isinstance(b, JobResult)
    ref = xclp_reference([(datas[p].X, datas[p].y) for p in PARTIES], b.seed, C, L, GraphParams(k=K))
    np.testing.assert_allclose(b.aggregate, ref.scores[20:40], atol=1e-6)
