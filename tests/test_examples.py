"""examples/federation_in_a_notebook.py runs as a user runs it (a real process, the API only):
alone it simulates XCLP on the demo data; given a coordinator (started here, with TLS, the two
other institutions joining through `xclp.client.run`), it takes part for hospital-a and writes
the labels that the plaintext simulation gives for the run's own seed."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from importlib.resources import files
from pathlib import Path

import pandas as pd

import xclp.client
from tests.harness import coordinator
from tests.helpers import deployment
from xclp.server.config import JobConfig, TlsFiles
from xclp.simulation import simulate
from xclp.v1.xclp import XclpJobParams

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "federation_in_a_notebook.py"
PARTIES = ("hospital-a", "hospital-b", "hospital-c")
PARAMS = {"n_classes": 10, "lsh_bits": 1024, "k": 5, "alpha": 0.99, "power": 3, "key_bits": 512,
          "insecure_test_keys": True}


def test_the_example_simulates_then_runs_one_party_for_real_against_a_coordinator(tmp_path) -> None:
    allow = deployment(tmp_path, PARTIES)
    config = JobConfig("xclp-demo", "xclp", XclpJobParams.parse(PARAMS), PARTIES, 3, 120.0, 120.0)
    tls = TlsFiles(tmp_path / "certs" / "server.pem", tmp_path / "certs" / "server-key.pem")
    demo = files("xclp.demo_data")
    results: dict[str, object] = {}

    def other(party: str, port: str) -> None:
        try:
            results[party] = xclp.client.run(
                job="xclp-demo", coordinator=f"localhost:{port}", ca_cert=tmp_path / "ca" / "ca.pem",
                identity=tmp_path / "keys" / f"{party}.key", peers=tmp_path / "allow.toml",
                data=pd.read_csv(demo / f"{party}.csv"), id_column="row_id", paillier_bits=512,
                insecure_test_keys=True, state=tmp_path / f"{party}.releases.json", progress=lambda line: None)
        except Exception as exc:  # reported by the assertion below
            results[party] = exc

    with coordinator(allow, [config], tls=tls) as (_, address):
        port = address.rsplit(":", 1)[1]
        threads = [threading.Thread(target=other, args=(p, port)) for p in PARTIES[1:]]
        for t in threads:
            t.start()
        env = {**os.environ, "XCLP_COORDINATOR": f"localhost:{port}", "XCLP_JOB": "xclp-demo",
               "XCLP_PARTY": "hospital-a", "XCLP_IDENTITY": str(tmp_path / "keys" / "hospital-a.key"),
               "XCLP_PEERS": str(tmp_path / "allow.toml"), "XCLP_CA_CERT": str(tmp_path / "ca" / "ca.pem"),
               "XCLP_PAILLIER_BITS": "512", "XCLP_INSECURE_TEST_KEYS": "1", "XCLP_OUT": str(tmp_path / "a.csv"),
               "XDG_STATE_HOME": str(tmp_path / "state")}
        done = subprocess.run([sys.executable, str(EXAMPLE)], env=env, cwd=tmp_path, capture_output=True, text=True,
                              timeout=600)
        for t in threads:
            t.join(120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "what each role would learn" in done.stdout
    assert "hospital-a: simulated XCLP labels its unlabeled rows with accuracy" in done.stdout
    assert "hospital-a: the real run with hospital-a, hospital-b, hospital-c labels its unlabeled rows" in done.stdout
    b = results["hospital-b"]
    assert isinstance(b, xclp.client.PartyResult), b
    frames = {p: pd.read_csv(demo / f"{p}.csv") for p in PARTIES}
    want = simulate({"type": "xclp", "params": PARAMS}, frames, secure=False, seed=b.job.seed, id_column="row_id")
    got = pd.read_csv(tmp_path / "a.csv", dtype={"row_id": str, "label": str})  # the id column keeps its name
    assert got["row_id"].tolist() == frames["hospital-a"]["row_id"].tolist()
    assert got["label"].tolist() == want["hospital-a"].predictions()["label"].tolist()


def test_the_example_alone_simulates_and_says_it_has_no_coordinator(tmp_path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("XCLP_")}
    done = subprocess.run([sys.executable, str(EXAMPLE)], env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "no coordinator given (XCLP_COORDINATOR)" in done.stdout
    assert done.stdout.count("simulated XCLP labels its unlabeled rows") == 3
