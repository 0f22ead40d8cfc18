"""The coordinator as a service, end to end with real processes over TLS: `xclp-server serve` with
no job and a SQLite state file, three `xclp-client agent`s, and the operator's `xclp-server job`
commands over the signed Admin API.

The module's stack: a coordinator started with no job, three agents (a, b, c) with a catalogue
each, and a party d that is allow-listed but has no agent: a run that expects a, b, c and d stays
`joining` until the test starts d as a one-off `xclp-client run`, so the tests look at a run, or
act in it, while it waits, without racing it.
"""

from __future__ import annotations

import csv
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import grpc
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.harness import challenge, key_bundle
from tests.helpers import load_identity, make_data, write_table
from xclp.client.models import ModelFile
from xclp.crypto import identity
from xclp.crypto.paillier import PaillierKeypair
from xclp.flynn import FlyHash, FlyNNParams, train_counts
from xclp.v1 import xclp_pb2 as pb
from xclp.v1 import xclp_pb2_grpc as pb_grpc
from xclp.v1.bundles import paillier_fields

pytestmark = pytest.mark.slow

BIN = Path(sys.executable).parent
D = 6
PARTIES = "abc"


def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / args[0]), *args[1:]], capture_output=True, text=True, timeout=timeout)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def job_file(root: Path, job_id: str, body: str, *, parties: str = '["a", "b", "c", "d"]', join: float = 4.0) -> Path:
    """A job file; a job with d reads the agents' "four" tables, one without it their "demo" tables,
    so that each table is released exactly among one set of parties (the ledger refuses another)."""
    if '"d"' in parties:
        body = body.replace('dataset = "demo"', 'dataset = "four"')
    path = root / f"{job_id}.toml"
    head, params = body.split("[params]")
    path.write_text(f'job_id = "{job_id}"\nexpected_parties = {parties}\nmin_parties = 3\n{head}'
                    f'[deadlines]\njoin_seconds = {join}\nstep_seconds = 120\n[params]{params}\n')
    return path


XCLP = ('type = "xclp"\ndataset = "demo"\n[params]\nn_classes = 3\nlsh_bits = 64\nk = 5\nkey_bits = 512\n'
        'insecure_test_keys = true')
FLYNN = 'type = "flynn"\ndataset = "demo"\n[params]\nn_classes = 3\nm = 128\ns = 3\nrho = 6\ntie_seed = 1'
STALLING = Path(__file__).with_name("stalling_party.py")


class Stack:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.server: subprocess.Popen | None = None
        self.agents: dict[str, subprocess.Popen] = {}
        self.port = free_port()
        self.admin = free_port()
        self.metrics = free_port()

    def serve(self) -> None:
        log = open(self.root / "server.log", "a")
        self.server = subprocess.Popen([str(BIN / "xclp-server"), "serve", "--config", str(self.root / "server.toml")],
                                       stderr=log)
        for _ in range(300):
            if cli("xclp-server", "health", "--coordinator", f"localhost:{self.port}", "--ca-cert",
                   str(self.root / "ca" / "ca.pem"), "--timeout", "1").returncode == 0:
                return
            assert self.server.poll() is None, (self.root / "server.log").read_text()
            time.sleep(0.2)
        raise AssertionError("the coordinator never became healthy")

    def stop_server(self) -> int:
        assert self.server is not None
        self.server.send_signal(signal.SIGTERM)
        return self.server.wait(timeout=30)

    def job(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return cli("xclp-server", "job", *args, "--admin", f"127.0.0.1:{self.admin}", "--operator", "alice",
                   "--operator-key", str(self.root / "ops" / "alice.key"), timeout=timeout)

    def show(self, run_id: str) -> dict:
        out = self.job("show", run_id, "--json")
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)

    def submit(self, path: Path) -> dict:
        out = self.job("submit", str(path), "--json")
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)

    def wait(self, run_id: str, until, timeout: float = 180) -> dict:
        give_up = time.monotonic() + timeout
        while True:
            info = self.show(run_id)
            if until(info):
                return info
            assert info["state"] not in ("done", "failed", "cancelled", "interrupted"), f"run {run_id} ended: {info}"
            assert time.monotonic() < give_up, f"run {run_id} never got there: {info}"
            time.sleep(0.2)

    def party_d(self, job_id: str, *, script: Path | None = None, step: str = "") -> subprocess.Popen:
        """d joins the run of `job_id` open now as a one-off `xclp-client run` (or through `script`)."""
        prefix = [sys.executable, str(script), step] if script else [str(BIN / "xclp-client")]
        return subprocess.Popen([*prefix, "run", "--coordinator", f"localhost:{self.port}", "--ca-cert",
                                 str(self.root / "ca" / "ca.pem"), "--job", job_id, "--party", "d", "--identity",
                                 str(self.root / "keys" / "d.key"), "--peers", str(self.root / "allow.toml"),
                                 "--data", str(self.root / "d.csv"), "--label-column", "diagnosis", "--id-column",
                                 "row_id", "--paillier-bits", "512", "--insecure-test-keys", "--workers", "0",
                                 "--min-parties", "3", "--out", str(self.root / "d-out")],
                                stderr=subprocess.PIPE, text=True)

    def agent_log(self, party: str) -> str:
        return (self.root / f"agent-{party}.log").read_text()


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    root = tmp_path_factory.mktemp("service")
    assert cli("xclp-server", "ca", "init", "--dir", str(root / "ca")).returncode == 0
    assert cli("xclp-server", "cert", "server", "--ca-dir", str(root / "ca"), "--out", str(root / "certs"),
               "--dns", "localhost").returncode == 0
    lines = [cli("xclp-client", "keygen", "--party", p, "--out", str(root / "keys")).stdout.strip() for p in "abcd"]
    (root / "allow.toml").write_text("[parties]\n" + "\n".join(lines) + "\n")
    operator = cli("xclp-server", "operator", "keygen", "--name", "alice", "--out", str(root / "ops"))
    assert operator.returncode == 0, operator.stderr
    s = Stack(root)
    (root / "server.toml").write_text(
        f'listen = "127.0.0.1:{s.port}"\nallow_list = "allow.toml"\nstate = "state/xclp.db"\n'
        f'admin_listen = "127.0.0.1:{s.admin}"\nmetrics_listen = "127.0.0.1:{s.metrics}"\n'
        f'[operators]\n{operator.stdout.strip()}\n[tls]\ncert = "certs/server.pem"\nkey = "certs/server-key.pem"\n')
    (root / "state").mkdir()
    data = {}
    for i, party in enumerate(PARTIES):
        data[party] = make_data(i, 40, D, unlabeled=4)
        write_table(root / f"{party}.csv", *data[party], [f"{party}{k}" for k in range(40)], label_column="diagnosis")
        (root / f"agent-{party}.toml").write_text(
            f'party = "{party}"\nidentity = "keys/{party}.key"\npeers = "allow.toml"\n'
            f'coordinator = "localhost:{s.port}"\nca_cert = "ca/ca.pem"\nout = "out-{party}"\npoll_seconds = 0.3\n'
            f'workers = 0\n[policy]\nmin_parties = 3\ninsecure_test_keys = true\njob_types = ["xclp", "flynn"]\n'
            f'[datasets.demo]\npath = "{party}.csv"\nlabel_column = "diagnosis"\nid_column = "row_id"\n'
            f'[datasets.four]\npath = "{party}-four.csv"\nlabel_column = "diagnosis"\nid_column = "row_id"\n')
        write_table(root / f"{party}-four.csv", *make_data(10 + i, 40, D, unlabeled=4),
                    [f"{party}{k}" for k in range(40)], label_column="diagnosis")
    write_table(root / "d.csv", *make_data(3, 40, D, unlabeled=4), [f"d{k}" for k in range(40)],
                label_column="diagnosis")
    s.data = data
    s.serve()
    for party in PARTIES:
        agent = [str(BIN / "xclp-client"), "agent", "--config", str(root / f"agent-{party}.toml")]
        s.agents[party] = subprocess.Popen(agent,
                                           stderr=open(root / f"agent-{party}.log", "w"))
    yield s
    for proc in s.agents.values():
        proc.send_signal(signal.SIGTERM)
    codes = {p: proc.wait(timeout=60) for p, proc in s.agents.items()}
    if s.server.poll() is None:
        s.stop_server()
    assert codes == dict.fromkeys(PARTIES, 0), "agents must exit 0 on SIGTERM"


def old_bundle(stack: Stack, job_id: str) -> tuple[str, pb.SignedBundle]:
    """What an attacker recorded: party a's correctly signed bundle for the run open now."""
    with grpc.secure_channel(f"localhost:{stack.port}",
                             grpc.ssl_channel_credentials((stack.root / "ca" / "ca.pem").read_bytes())) as channel:
        key = load_identity(stack.root / "keys" / "a.key")
        asked = challenge(pb_grpc.CoordinatorStub(channel), key, "a", job_id)
    paillier = PaillierKeypair.generate(512, allow_insecure_test_size=True)
    bundle = key_bundle(key, "a", job_id, spec=asked.spec, nonce=asked.run_nonce,
                        summary=pb.DataSummary(rows=40, dim=D), **paillier_fields(paillier.public))
    signed = identity.sign_bundle(key, bundle)
    return asked.run_id, pb.SignedBundle(bundle=signed.bundle, signature=signed.signature)


def replay(stack: Stack, job_id: str, bundle: pb.SignedBundle) -> grpc.RpcError:
    credentials = grpc.ssl_channel_credentials((stack.root / "ca" / "ca.pem").read_bytes())
    with grpc.secure_channel(f"localhost:{stack.port}", credentials) as channel, \
            pytest.raises(grpc.RpcError) as refused:
        pb_grpc.CoordinatorStub(channel).Join(pb.JoinRequest(job_id=job_id, bundle=bundle,
                                                             summary=pb.DataSummary(rows=40, dim=D)), timeout=10)
    return refused.value


def scrape(stack: Stack) -> dict[tuple[str, tuple], float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{stack.metrics}/metrics", timeout=10).read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_agents_run_submitted_jobs_history_survives_a_restart_and_a_second_run_refuses_an_old_bundle(stack):
    root = stack.root
    xclp_job = job_file(root, "xclp-agents", XCLP, join=600)
    first = stack.submit(xclp_job)
    run1 = first["run_id"]
    assert first["state"] == "joining" and first["submitted_by"] == "alice"
    # seen in list and show while it waits for d: a, b and c have joined
    recorded_run, recorded = old_bundle(stack, "xclp-agents")
    assert recorded_run == run1
    joined = stack.wait(run1, lambda i: sum(p["state"] == "joined" for p in i["parties"]) == 3
                        or i["state"] != "joining")
    assert joined["state"] == "joining", joined
    listed = json.loads(stack.job("list", "--json").stdout)
    assert [r["run_id"] for r in listed if r["job_id"] == "xclp-agents"] == [run1]
    human = stack.job("show", run1)
    assert human.returncode == 0 and f"run {run1}: job xclp-agents (xclp), joining" in human.stdout
    d = stack.party_d("xclp-agents")  # the last party: the run starts
    assert d.wait(timeout=180) == 0, d.stderr.read()
    done = stack.wait(run1, lambda i: i["state"] == "done")
    assert {p["party_id"]: p["state"] for p in done["parties"]} == dict.fromkeys("abcd", "joined")
    steps = {s["name"]: s for s in done["steps"]}
    assert steps["secure_hamming"]["seconds"] > 0 and int(done["bytes_total"]) > 0
    # the agents' outputs: <out>/<job>/<run>/, whole, their own rows
    for party in PARTIES:
        out = root / f"out-{party}" / "xclp-agents"
        assert sorted(p.name for p in out.iterdir()) == [run1], list(out.iterdir())
        rows = list(csv.DictReader(open(out / run1 / "predictions.csv")))
        y = stack.data[party][1]
        assert [r["row_id"] for r in rows] == [f"{party}{i}" for i in range(len(y))]
        assert {r["label"] for r in rows} <= {"0", "1", "2"}
        meta = json.loads((out / run1 / "run.json").read_text())
        assert meta["run_id"] == run1 and meta["participants"] == ["a", "b", "c", "d"]

    # two jobs in one submission: a FlyNN job by catalogue name, and one naming a data set a's
    # catalogue lacks
    missing_icu = FLYNN.replace('dataset = "demo"\n', '[datasets]\na = "icu"\nb = "demo"\nc = "demo"\n')
    both = stack.job("submit", str(job_file(root, "flynn-agents", FLYNN, parties='["a", "b", "c"]')),
                     str(job_file(root, "flynn-missing", missing_icu, join=600)), "--json")
    assert both.returncode == 0, both.stderr
    flynn, missing = json.loads(both.stdout)
    # every agent's FlyNN model equals the pooled one bit for bit
    stack.wait(flynn["run_id"], lambda i: i["state"] == "done")
    X = np.vstack([stack.data[p][0] for p in PARTIES])
    y = np.concatenate([stack.data[p][1] for p in PARTIES])
    for party in PARTIES:
        model = ModelFile.load(root / f"out-{party}" / "flynn-agents" / flynn["run_id"] / "model.npz")
        want = train_counts(FlyHash.from_seed(model.seed, FlyNNParams(D, 128, 3, 6)), X[y >= 0], y[y >= 0], 3)
        assert np.array_equal(model.aggregate, want)

    # a refuses the other and says why; the run waits
    give_up = time.monotonic() + 30
    while f"refused run {missing['run_id']} of job flynn-missing" not in stack.agent_log("a"):
        assert time.monotonic() < give_up, stack.agent_log("a")
        time.sleep(0.2)
    assert "data set 'icu', which is not in this agent's catalogue" in stack.agent_log("a")

    # the second run of the same job: a bundle recorded in the first is refused
    second = stack.submit(xclp_job)
    run2 = second["run_id"]
    assert run2 != run1 and second["state"] == "joining"
    refused = replay(stack, "xclp-agents", recorded)
    assert refused.code() == grpc.StatusCode.FAILED_PRECONDITION and "another run's nonce" in refused.details()
    d = stack.party_d("xclp-agents")
    assert d.wait(timeout=180) == 0, d.stderr.read()
    stack.wait(run2, lambda i: i["state"] == "done")
    for party in PARTIES:
        assert sorted(p.name for p in (root / f"out-{party}" / "xclp-agents").iterdir()) == sorted([run1, run2])

    # metrics, scraped: runs by state, step seconds, bytes, Pull streams, the refused replay
    metrics = scrape(stack)
    assert metrics[("xclp_runs", (("state", "done"),))] == 3
    assert metrics[("xclp_runs", (("state", "joining"),))] == 1
    assert metrics[("xclp_step_seconds_count", (("job_type", "xclp"), ("step", "secure_hamming")))] == 2
    assert metrics[("xclp_bytes_moved_total", (("direction", "relayed"), ("job_type", "xclp")))] > 0
    assert metrics[("xclp_bytes_moved_total", (("direction", "out"), ("job_type", "flynn")))] > 0
    assert metrics[("xclp_refused_joins_total", (("reason", "ReplayRefused"),))] == 1
    assert ("xclp_connected_parties", ()) in metrics

    # restart: the history stays; the run left joining is interrupted, with the reason
    assert stack.stop_server() == 0
    stack.serve()
    after = {r["run_id"]: r for r in json.loads(stack.job("list", "--json").stdout)}
    assert {after[r]["state"] for r in (run1, run2, flynn["run_id"])} == {"done"}
    assert after[missing["run_id"]]["state"] == "interrupted"
    assert "shutting down" in after[missing["run_id"]]["reason"]
    assert {p["party_id"] for p in after[run1]["parties"]} == {"a", "b", "c", "d"}
    assert {s["name"] for s in after[run1]["steps"]} >= {"seed", "secure_hamming", "rowsums"}
    for party in "bc":  # b and c had joined the interrupted run: they heard why, and kept running
        assert (f"run {missing['run_id']} of job flynn-missing stopped: the coordinator is shutting down; run "
                f"{missing['run_id']} is interrupted; nothing written") in stack.agent_log(party)
        assert stack.agents[party].poll() is None
    # the submitted job the stop cut runs again, as alice's; cancelled here, as a would refuse it again
    [rerun] = [r for r in after.values() if r["job_id"] == "flynn-missing" and r["run_id"] != missing["run_id"]]
    assert rerun["state"] == "joining" and rerun["submitted_by"] == "alice", rerun
    assert stack.job("cancel", rerun["run_id"]).returncode == 0
    stack.wait(rerun["run_id"], lambda i: i["state"] == "cancelled")


def test_the_agents_ledgers_refuse_the_moments_again_among_fewer_under_reordered_classes(stack):
    """Through the agents: the operator runs a standardising FlyNN job among a, b, c and d, then
    another job (another id, `classes` declared in another order, d left out) among a, b, c. The
    second run's pooled moments minus the first's would be d's exact count, sum and sum of squares
    per feature. The agents' ledgers name the data set by the table as read, before the job's
    label mapping, and keep its exact releases among one set of parties: each refuses before
    masking, the run fails, nothing of it is revealed, and each agent says why."""
    root = stack.root
    std = FLYNN + "\nstandardise = true"
    first = stack.submit(job_file(root, "std-four", std, join=600))
    stack.wait(first["run_id"], lambda i: sum(p["state"] == "joined" for p in i["parties"]) == 3
               or i["state"] != "joining")
    d = stack.party_d("std-four")
    assert d.wait(timeout=180) == 0, d.stderr.read()
    stack.wait(first["run_id"], lambda i: i["state"] == "done")
    reordered = std.replace("n_classes = 3", 'classes = ["1", "0", "2"]').replace('"demo"', '"four"')
    second = stack.submit(job_file(root, "std-three", reordered, parties='["a", "b", "c"]'))
    info = stack.wait(second["run_id"], lambda i: i["state"] in ("failed", "done"))
    assert info["state"] == "failed", info
    assert not [s for s in info["steps"] if s["name"].startswith("moments_")], info["steps"]  # nothing confirmed
    for party in PARTIES:
        log = stack.agent_log(party)
        assert "this party released this data set exactly among a, b, c, d (job '" in log, log[-2000:]
        assert "not releasing it among a, b, c (`xclp-client ledger move" in log, log[-2000:]


def test_a_run_cancelled_mid_secure_hamming_stops_the_agents_cleanly_and_leaves_nothing(stack):
    """d is a real party that stalls in SecureHamming, so the run is there, with a, b and c having
    sent their encrypted slices and waiting for d's, when the operator cancels it."""
    root = stack.root
    run = stack.submit(job_file(root, "xclp-cancel", XCLP, join=600))["run_id"]
    stack.wait(run, lambda i: sum(p["state"] == "joined" for p in i["parties"]) == 3)
    d = stack.party_d("xclp-cancel", script=STALLING, step="secure_hamming")
    try:
        for line in d.stderr:
            if "STALLING" in line:
                break
        busy = stack.wait(run, lambda i: i.get("step") == "secure_hamming")
        assert busy["state"] == "running" and "secure_hamming" not in {s["name"] for s in busy["steps"]}
        out = stack.job("cancel", run, "--reason", "wrong data set", "--json")
        assert out.returncode == 0, out.stderr
        cancelled = json.loads(out.stdout)
        assert cancelled["state"] == "cancelled" and cancelled["reason"] == "wrong data set"
        for party in PARTIES:
            give_up = time.monotonic() + 120
            stopped = f"run {run} of job xclp-cancel stopped: the run was cancelled: wrong data set"
            while stopped not in stack.agent_log(party):
                assert time.monotonic() < give_up, stack.agent_log(party)
                time.sleep(0.2)
            out_dir = root / f"out-{party}" / "xclp-cancel"
            assert not out_dir.exists() or not list(out_dir.iterdir()), "nothing half-written"
            assert stack.agents[party].poll() is None
    finally:
        d.kill()
        d.wait()
    again = stack.job("cancel", run)
    assert again.returncode != 0 and "already cancelled" in again.stderr
    # the agents still take part in the next run
    flynn = stack.submit(job_file(root, "flynn-after-cancel", FLYNN, parties='["a", "b", "c"]'))
    stack.wait(flynn["run_id"], lambda i: i["state"] == "done")


def test_the_admin_api_refuses_an_unknown_operator_and_a_wrong_key(stack):
    intruder = cli("xclp-server", "operator", "keygen", "--name", "mallory", "--out", str(stack.root / "intruder"))
    assert intruder.returncode == 0
    as_mallory = cli("xclp-server", "job", "list", "--admin", f"127.0.0.1:{stack.admin}", "--operator", "mallory",
                     "--operator-key", str(stack.root / "intruder" / "mallory.key"))
    # one answer for an unknown operator and a wrong key: a stranger learns nobody's name
    assert as_mallory.returncode == 4 and "for operator 'mallory' (an unknown operator, or another key)" \
        in as_mallory.stderr
    posing = cli("xclp-server", "job", "list", "--admin", f"127.0.0.1:{stack.admin}", "--operator", "alice",
                 "--operator-key", str(stack.root / "intruder" / "mallory.key"))
    assert posing.returncode == 4 and "for operator 'alice' (an unknown operator, or another key)" in posing.stderr
    env_ok = subprocess.run([str(BIN / "xclp-server"), "job", "list"], capture_output=True, text=True, timeout=60,
                            env={**os.environ, "XCLP_ADMIN": f"127.0.0.1:{stack.admin}", "XCLP_OPERATOR": "alice",
                                 "XCLP_OPERATOR_KEY": str(stack.root / "ops" / "alice.key")})
    assert env_ok.returncode == 0 and env_ok.stdout.startswith("  RUN")
