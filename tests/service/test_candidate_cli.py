"""XCLP on candidate pairs end to end through the CLIs (docs/design.md §10.3): three `xclp-client run`
processes against a coordinator over TLS (512-bit test keys, L = 64, 3 × 240 rows). Every party's
predictions.csv is the plaintext reference's on the same schedule; the summary says how much of
all pairs' ciphertexts the schedule cost."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.harness import PARTIES, coordinator
from tests.helpers import deployment, write_table
from tests.oracles.party_view import party_view
from tests.service.test_xclp_job import read_predictions
from xclp import candidates as cd
from xclp.crypto.secure_hamming import SlotLayout
from xclp.graph import GraphParams
from xclp.reference import xclp_reference
from xclp.server.config import JobConfig, TlsFiles
from xclp.v1.xclp import XclpJobParams

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
L, C, N, K = 64, 3, 240, 5
# one probe per row: the budget holds whatever centres the (random) common seed draws
CANDIDATES = {"pair_budget": 0.9, "centres": 6, "probes": 1}


def test_xclp_on_candidate_pairs_through_the_clis_predicts_what_the_reference_does(tmp_path) -> None:
    allow = deployment(tmp_path, PARTIES)
    rng = np.random.default_rng(3)
    centres = rng.normal(scale=3.0, size=(C, 8))
    data = {}
    for p in PARTIES:
        y = rng.integers(0, C, size=N)
        X = centres[y] + rng.normal(size=(N, 8))
        data[p] = (X, np.where(rng.random(N) < 0.2, y, -1))
        write_table(tmp_path / f"{p}.csv", X, data[p][1], [f"{p}-{i}" for i in range(N)])
    params = XclpJobParams.parse({"n_classes": C, "lsh_bits": L, "k": K, "key_bits": 512, "insecure_test_keys": True,
                                  **CANDIDATES})
    config = JobConfig("cand", "xclp", params, PARTIES, 2, 120.0, 60.0, summary_path=tmp_path / "summary.json")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "XCLP_TESTING": "1"}
    tls = TlsFiles(tmp_path / "certs" / "server.pem", tmp_path / "certs" / "server-key.pem")
    with coordinator(allow, [config], tls=tls) as (coord, address):
        port = address.rsplit(":", 1)[1]
        procs = {p: subprocess.Popen(
            [sys.executable, "-m", "xclp.client.cli", "run", "--coordinator", f"localhost:{port}",
             "--ca-cert", str(tmp_path / "ca" / "ca.pem"), "--job", "cand", "--party", p,
             "--identity", str(tmp_path / "keys" / f"{p}.key"), "--peers", str(tmp_path / "allow.toml"),
             "--min-parties", "2", "--data", str(tmp_path / f"{p}.csv"), "--id-column", "row_id",
             "--paillier-bits", "512", "--insecure-test-keys", "--out", str(tmp_path / "out" / p),
             "--debug-dump-seed", str(tmp_path / f"{p}.seed")], stderr=subprocess.PIPE, text=True, env=env)
            for p in PARTIES}
        logs = {p: proc.communicate(timeout=240)[1] for p, proc in procs.items()}
        coord.jobs["cand"].done_event.wait(30)
    assert all(procs[p].returncode == 0 for p in PARTIES), logs
    assert "candidate pairs: " in logs["a"] and "probes per row sent" in logs["a"]

    seed = (tmp_path / "a.seed").read_bytes()
    unit = {p: cd.unit_rows(data[p][0]) for p in PARTIES}
    found = cd.initial_centres(seed, 6, unit[PARTIES[0]].shape[1])
    probes = {p: cd.nearest_centres(unit[p], found, 1) for p in PARTIES}
    pooled = np.sum([cd.probe_table(probes[p], 6) for p in PARTIES], axis=0)
    sizes = dict.fromkeys(PARTIES, N)
    used, budgets, fraction = cd.choose_probes(pooled, sizes, list(itertools.permutations(PARTIES, 2)),
                                               SlotLayout(512, L).slots, 1.0, 0.9)
    mask = cd.candidate_mask({p: cd.centre_lists(probes[p], used, budgets[p]) for p in PARTIES}, sizes)
    assert mask.mean() < 0.75  # a third of all pairs are a party's own; most cross pairs were left out
    ref = xclp_reference([data[p] for p in PARTIES], seed, C, L, GraphParams(k=K), candidates=mask)
    for j, p in enumerate(PARTIES):
        _, labels, _, scores = read_predictions(tmp_path / "out" / p / "predictions.csv")
        want_labels, _, want_scores = party_view(ref.scores[ref.party_rows(j)], data[p][1], C)
        np.testing.assert_array_equal(labels, want_labels)
        np.testing.assert_allclose(scores, want_scores, rtol=0, atol=1e-6)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["candidates"] == {"probes": used, "ciphertext_fraction": fraction} and fraction <= 0.9
