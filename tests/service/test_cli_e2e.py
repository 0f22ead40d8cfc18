"""End to end with real processes: `xclp-server` and `xclp-client` console scripts over TLS on localhost.

One coordinator serves several jobs at once; all parties of all jobs run concurrently (module
fixture), then each test checks one property. Certificates and identity keys are made with the
CLIs themselves, so these tests also show the certificate helpers produce working TLS.
"""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from tests.helpers import make_data, write_table
from xclp import race
from xclp.client.models import ModelFile
from xclp.flynn import FlyHash, FlyNNModel, FlyNNParams, train_counts
from xclp.v1.status import EXIT_BAD_INPUT, EXIT_REFUSED

pytestmark = pytest.mark.slow

BIN = Path(sys.executable).parent
ROOT = Path(__file__).resolve().parents[2]
D = 8


def cli(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / args[0]), *args[1:]], capture_output=True, text=True, timeout=120, **kw)


SCALES = np.array([1.0, 1e3, 1e-2, 7.0, 1.0, 1e4, 0.5, 3.0])
NAMES = ("benign", "malignant", "other")


def write_csv(path: Path, X: np.ndarray, y: np.ndarray | None, prefix: str, names=None) -> None:
    write_table(path, X, y, [f"{prefix}{i}" for i in range(X.shape[0])], label_column="diagnosis", names=names)


JOBS = {
    "flynn-tls": ('type = "flynn"\nexpected_parties = ["a", "b", "c"]\n', "[params]\nn_classes = 3\nm = 256\ns = "
                                                                          "3\nrho = 8\ntie_seed = 7\n"),
    "race-tls": ('type = "race"\nexpected_parties = ["a", "b", "c"]\n', '[params]\nrows = 16\nwidth = 16\nfamily = '
                                                                        '"srp"\np = 4\n'),
    "flynn-kill": ('type = "flynn"\nexpected_parties = ["a", "b", "c"]\nmin_parties = 2\n',
                   "[params]\nn_classes = 3\nm = 256\ns = 3\nrho = 8\n"),
    "flynn-prep": ('type = "flynn"\nexpected_parties = ["a", "b", "c"]\n',
                   '[params]\nm = 256\ns = 3\nrho = 8\ntie_seed = 3\nclasses = ["benign", "malignant", "other"]\n'
                   'standardise = true\nimpute = "mean"\n'),
    "fedavg-xclp": ('type = "fedavg"\nexpected_parties = ["a", "b", "c"]\n',
                    '[params]\nn_classes = 3\nhidden = [6]\nrounds = 2\nlocal_epochs = 2\nbatch_size = 8\n'
                    'pseudo_label = "xclp"\nstandardise = true\nk = 5\nlsh_bits = 64\nkey_bits = 512\n'
                    'insecure_test_keys = true\n'),
    "dbcl-tls": ('type = "dbcl"\nexpected_parties = ["a", "b", "c"]\nmodel = "dbcl-coordinator.npz"\n',
                 '[params]\nn_classes = 3\nhidden = [6, 5]\nrounds = 6\nbatch_size = 8\noptimiser = "rmsprop"\n'
                 'learning_rate = 0.01\nstandardise = true\n'),
    "dbcl-withheld": ('type = "dbcl"\nexpected_parties = ["a", "b", "c"]\nmodel = "dbcl-withheld.npz"\n',
                      '[params]\nn_classes = 3\nrounds = 2\nwithhold_model = true\n'),
    "locked": ('type = "flynn"\nexpected_parties = ["a", "b", "c"]\n', "[params]\nn_classes = 3\nm = 64\ns = 3\nrho = "
                                                                       "4\n"),
}


@pytest.fixture(scope="module")
def deploy(tmp_path_factory):
    root = tmp_path_factory.mktemp("deploy")
    assert cli("xclp-server", "ca", "init", "--dir", str(root / "ca")).returncode == 0
    assert cli("xclp-server", "cert", "server", "--ca-dir", str(root / "ca"), "--out", str(root / "certs"),
               "--dns", "localhost", "--ip", "127.0.0.1").returncode == 0
    lines = []
    for party in ("a", "b", "c", "mallory"):
        out = cli("xclp-client", "keygen", "--party", party, "--out", str(root / "keys"))
        assert out.returncode == 0, out.stderr
        if party != "mallory":
            lines.append(out.stdout.strip())
    assert cli("xclp-client", "keygen", "--party", "a", "--out", str(root / "imposter")).returncode == 0
    (root / "allow.toml").write_text("[parties]\n" + "\n".join(lines) + "\n")
    data = {}
    for i, party in enumerate("abc"):
        X, y = make_data(i)
        data[party] = (X, y)
        if party == "a":
            write_csv(root / "a.csv", X, y, "a")
        else:
            np.savez(root / f"{party}.npz", X=X, y=y, ids=np.array([f"{party}{k}" for k in range(len(y))]))
    Xq, _ = make_data(99, n=30)
    write_csv(root / "queries.csv", Xq, None, "q")
    # flynn-prep: unscaled features, a gap in a's table, class names in a's CSV (b and c: numbers)
    for party in "abc":
        X, y = data[party]
        X = X * SCALES
        if party == "a":
            X[5, 2] = np.nan
            write_csv(root / "a-prep.csv", X, y, "a", names=NAMES)
        else:
            np.savez(root / f"{party}-prep.npz", X=X, y=y)
    write_csv(root / "queries-prep.csv", Xq * SCALES, None, "q")
    jobs = []
    for job_id, (head, params) in JOBS.items():
        path = root / f"{job_id}.toml"
        path.write_text(f'job_id = "{job_id}"\n{head}[deadlines]\njoin_seconds = 120\nstep_seconds = 60\n'
                        f'reconnect_seconds = 3\n{params}')  # a killed party is dropped 3 s after its connection
        jobs.append(f'"{path.name}"')
    (root / "server.toml").write_text(
        f'listen = "127.0.0.1:0"\nallow_list = "allow.toml"\nport_file = "port"\njobs = [{", ".join(jobs)}]\n'
        '[tls]\ncert = "certs/server.pem"\nkey = "certs/server-key.pem"\n')
    server = subprocess.Popen([str(BIN / "xclp-server"), "serve", "--config", str(root / "server.toml")],
                              stderr=open(root / "server.log", "w"))
    for _ in range(300):
        if (root / "port").exists() and (root / "port").read_text().strip():
            break
        assert server.poll() is None, (root / "server.log").read_text()
        time.sleep(0.1)
    port = int((root / "port").read_text())
    env = {**os.environ, "PYTHONPATH": str(ROOT)}

    def party_cmd(job_id: str, party: str, key_dir: str = "keys", peers: Path | None = None) -> list[str]:
        data_file = "a.csv" if party == "a" else ("b.npz" if party == "mallory" else f"{party}.npz")
        if job_id == "flynn-prep":
            data_file = "a-prep.csv" if party == "a" else f"{party}-prep.npz"
        xclp = ["--paillier-bits", "512", "--insecure-test-keys", "--workers", "0"] if job_id == "fedavg-xclp" else []
        if job_id.startswith("dbcl"):  # these DBCL jobs run without DP, which a party takes only when told
            xclp = ["--allow-non-dp-dbcl"]
        return [str(BIN / "xclp-client"), "run", "--coordinator", f"localhost:{port}", "--ca-cert",
                str(root / "ca" / "ca.pem"), "--job", job_id, "--party", party, "--identity",
                str(root / key_dir / f"{party}.key"), "--peers", str(peers or root / "allow.toml"),
                "--min-parties", "2",
                # the jobs share each party's table among different sets of parties (a party killed
                # mid-job): the ledger would keep the table among one set (tests/threat_model/)
                "--allow-rerun",
                "--data", str(root / data_file), "--label-column",
                "diagnosis", "--id-column", "row_id", "--out", str(root / f"{job_id}-{party}.npz"), *xclp]

    def pin_self(party: str, key_dir: str) -> Path:
        """The peers file a hostile party would write (the allow-list with its own key for itself),
        so that the coordinator is the one to refuse it."""
        key = (root / key_dir / f"{party}.pub").read_text().strip()
        kept = [line for line in lines if not line.startswith(f"{party} =")]
        path = root / f"peers-{key_dir}-{party}.toml"
        path.write_text("[parties]\n" + "\n".join([*kept, f'{party} = "{key}"']) + "\n")
        return path

    procs: dict[tuple[str, str], subprocess.Popen] = {}
    for job_id in ("flynn-tls", "race-tls", "flynn-prep", "fedavg-xclp", "dbcl-tls", "dbcl-withheld"):
        for party in "abc":
            procs[(job_id, party)] = subprocess.Popen(party_cmd(job_id, party), stderr=subprocess.PIPE, text=True)
    for party in "ab":
        procs[("flynn-kill", party)] = subprocess.Popen(party_cmd("flynn-kill", party), stderr=subprocess.PIPE,
                                                        text=True)
    stuck = subprocess.Popen([sys.executable, str(Path(__file__).parent / "stuck_party.py"), f"localhost:{port}",
                              str(root / "ca" / "ca.pem"), "flynn-kill", "c", str(root / "keys" / "c.key"),
                              str(root / "c.npz"), str(root / "allow.toml")],
                             stderr=subprocess.PIPE, text=True, env=env)
    killed = threading.Event()

    def kill_when_stalling() -> None:
        for line in stuck.stderr:
            if "STALLING" in line:
                stuck.send_signal(signal.SIGKILL)
                killed.set()
                return

    threading.Thread(target=kill_when_stalling, daemon=True).start()
    outcomes = {key: (p.wait(timeout=240), p.stderr.read()) for key, p in procs.items()}
    stuck.wait(timeout=60)
    refusals = {name: subprocess.run(cmd, capture_output=True, text=True, timeout=120) for name, cmd in (
        ("mallory", party_cmd("locked", "mallory", peers=pin_self("mallory", "keys"))),
        ("imposter", party_cmd("locked", "a", key_dir="imposter", peers=pin_self("a", "imposter"))))}
    yield dict(root=root, port=port, data=data, outcomes=outcomes, killed=killed.is_set(), refusals=refusals,
               server=server)
    server.send_signal(signal.SIGTERM)
    assert server.wait(timeout=20) == 0, "the coordinator must exit cleanly on SIGTERM"


def pooled(data, parties):
    X = np.vstack([data[p][0] for p in parties])
    y = np.concatenate([data[p][1] for p in parties])
    return X, y


def assert_ok(deploy, job_id, parties):
    for party in parties:
        rc, err = deploy["outcomes"][(job_id, party)]
        assert rc == 0, f"{job_id}/{party} exited {rc}: {err}"


def test_federated_flynn_equals_pooled_model_bit_for_bit_and_predicts_identically(deploy):
    assert_ok(deploy, "flynn-tls", "abc")
    root = deploy["root"]
    models = [ModelFile.load(root / f"flynn-tls-{p}.npz") for p in "abc"]
    X, y = pooled(deploy["data"], "abc")
    m = models[0]
    flyhash = FlyHash.from_seed(m.seed, FlyNNParams(D, 256, 3, 8))
    want = train_counts(flyhash, X[y >= 0], y[y >= 0], 3)
    for model in models:
        assert model.seed == m.seed and model.aggregate.dtype == np.uint32
        assert np.array_equal(model.aggregate, want)
    out = root / "pred.csv"
    res = cli("xclp-client", "predict", "--model", str(root / "flynn-tls-b.npz"), "--data", str(root / "queries.csv"),
              "--id-column", "row_id", "--out", str(out))
    assert res.returncode == 0, res.stderr
    rows = list(csv.DictReader(open(out)))
    Xq, _ = make_data(99, n=30)
    expected = FlyNNModel(want, 0.0, flyhash).predict(Xq, tie_seed=7)
    assert list(rows[0])[0] == "row_id"  # the id column keeps the name --data gave it
    assert [r["row_id"] for r in rows] == [f"q{i}" for i in range(30)]
    assert [int(r["prediction"]) for r in rows] == expected.tolist()


def test_standardised_flynn_with_class_names_predicts_names_from_pooled_scaling(deploy):
    """standardise + impute + classes through the CLIs: a's CSV says "benign", has an empty cell and
    unscaled columns; the model file keeps the pooled scaling, so `predict` scales new rows alike
    and writes class names."""
    assert_ok(deploy, "flynn-prep", "abc")
    root = deploy["root"]
    assert "filled 1 empty cells of column 'f2' with the pooled mean" in deploy["outcomes"][("flynn-prep", "a")][1]
    X, y = pooled(deploy["data"], "abc")
    X = X * SCALES
    X[5, 2] = np.nan
    mean, std = np.nanmean(X, axis=0), np.nanstd(X, axis=0)
    Xs = (np.where(np.isnan(X), mean, X) - mean) / std
    model = ModelFile.load(root / "flynn-prep-c.npz")
    np.testing.assert_allclose(model.scaling.mean, mean, rtol=1e-12)
    np.testing.assert_allclose(model.scaling.std, std, rtol=1e-12)
    flyhash = FlyHash.from_seed(model.seed, FlyNNParams(D, 256, 3, 8))
    want = train_counts(flyhash, Xs[y >= 0], y[y >= 0], 3)
    assert np.array_equal(model.aggregate, want)
    res = cli("xclp-client", "predict", "--model", str(root / "flynn-prep-a.npz"), "--data",
              str(root / "queries-prep.csv"), "--id-column", "row_id", "--out", str(root / "pred-prep.csv"))
    assert res.returncode == 0, res.stderr
    rows = list(csv.DictReader(open(root / "pred-prep.csv")))
    Xq = make_data(99, n=30)[0]  # queries-prep.csv holds Xq · SCALES: scaled back, the pooled statistics apply
    expected = FlyNNModel(want, 0.0, flyhash).predict((Xq * SCALES - mean) / std, tie_seed=3)
    assert [r["prediction"] for r in rows] == [NAMES[c] for c in expected]


def test_federated_race_sketch_equals_pooled_sketch(deploy):
    assert_ok(deploy, "race-tls", "abc")
    root = deploy["root"]
    X, _ = pooled(deploy["data"], "abc")
    m = ModelFile.load(root / "race-tls-c.npz")
    hashes = race.RaceHashes.from_seed(m.seed, race.RaceParams(16, 16, "srp", 4), D)
    assert np.array_equal(m.aggregate, race.sketch(hashes, X))
    out = root / "kde.csv"
    res = cli("xclp-client", "query", "--model", str(root / "race-tls-a.npz"), "--data", str(root / "queries.csv"),
              "--id-column", "row_id", "--out", str(out))
    assert res.returncode == 0, res.stderr
    got = np.array([float(r["kde"]) for r in csv.DictReader(open(out))])
    np.testing.assert_allclose(got, race.query(race.sketch(hashes, X), None, hashes, make_data(99, n=30)[0]), rtol=1e-9)


def test_party_killed_mid_job_leaves_a_model_for_the_others(deploy):
    assert deploy["killed"], "the stalling party never reached the sum step"
    assert_ok(deploy, "flynn-kill", "ab")
    root = deploy["root"]
    X, y = pooled(deploy["data"], "ab")
    m = ModelFile.load(root / "flynn-kill-a.npz")
    flyhash = FlyHash.from_seed(m.seed, FlyNNParams(D, 256, 3, 8))
    assert np.array_equal(m.aggregate, train_counts(flyhash, X[y >= 0], y[y >= 0], 3))
    log = (root / "server.log").read_text()
    assert "dropped c (disconnected, and did not reconnect within 3 s)" in log
    assert "step sum attempt 1 started with 2 parties" in log


def test_unauthorised_and_imposter_parties_are_refused(deploy):
    mallory, imposter = deploy["refusals"]["mallory"], deploy["refusals"]["imposter"]
    assert mallory.returncode == EXIT_REFUSED and "allow-list" in mallory.stderr
    assert imposter.returncode == EXIT_REFUSED and "identity key" in imposter.stderr
    assert mallory.stderr.splitlines()[-1].startswith("xclp-client: error: ")


def test_the_log_shows_steps_and_bytes_but_no_secrets(deploy):
    log = (deploy["root"] / "server.log").read_text()
    assert "listening on port" in log and "(TLS)" in log
    assert "step sum attempt 0 complete" in log and "bytes in" in log
    seed = ModelFile.load(deploy["root"] / "flynn-tls-a.npz").seed
    assert seed.hex() not in log and "ed25519:" not in log


def test_cli_input_errors_exit_2_with_one_line(deploy, tmp_path):
    res = cli("xclp-client", "run", "--job", "x")
    assert res.returncode == EXIT_BAD_INPUT and res.stderr.strip().startswith("xclp-client: error: run needs")
    bad = tmp_path / "bad.csv"
    bad.write_text("f0,label\n1.0,1\nabc,2\n")
    res = cli("xclp-client", "predict", "--model", str(deploy["root"] / "flynn-tls-a.npz"), "--data", str(bad),
              "--out", str(tmp_path / "p.csv"))
    assert res.returncode == EXIT_BAD_INPUT and "line 3" in res.stderr and len(res.stderr.strip().splitlines()) == 1
    res = cli("xclp-server", "serve", "--allow-list", str(deploy["root"] / "allow.toml"), "--job",
              str(deploy["root"] / "locked.toml"))
    assert res.returncode == EXIT_BAD_INPUT and "--tls-cert" in res.stderr


def test_fedavg_with_xclp_pseudo_labels_trains_one_network_that_predict_uses(deploy):
    """type = "fedavg", pseudo_label = "xclp", standardised, over TLS with real processes: every party
    writes the same network (its model file says so), and `predict` gives the network's classes."""
    assert_ok(deploy, "fedavg-xclp", "abc")
    root = deploy["root"]
    models = [ModelFile.load(root / f"fedavg-xclp-{p}.npz") for p in "abc"]
    for model in models:
        assert model.job_type == "fedavg" and model.scaling is not None
        np.testing.assert_array_equal(model.aggregate, models[0].aggregate)
    _, err = deploy["outcomes"][("fedavg-xclp", "a")]
    assert "round 1: model received" in err and "SecureHamming" in err
    out = root / "fedavg-pred.csv"
    res = cli("xclp-client", "predict", "--model", str(root / "fedavg-xclp-a.npz"), "--data", str(root / "queries.csv"),
              "--id-column", "row_id", "--out", str(out))
    assert res.returncode == 0, res.stderr
    with open(out) as fh:
        rows = list(csv.DictReader(fh))
    from xclp.data.tables import load
    queries = load(root / "queries.csv", label_column=None, id_column="row_id")
    want = models[0].loaded().network.predict(models[0].features(queries))
    assert [r["row_id"] for r in rows] == list(queries.ids)
    assert [int(r["prediction"]) for r in rows] == want.tolist()
    race = cli("xclp-client", "predict", "--model", str(root / "race-tls-a.npz"), "--data", str(root / "queries.csv"),
               "--id-column", "row_id", "--out", str(root / "nope.csv"))
    assert race.returncode == EXIT_BAD_INPUT and "xclp-client query" in race.stderr


def test_dbcl_parties_get_the_coordinators_network_unless_it_is_withheld(deploy):
    """type = "dbcl" over TLS with real processes: every party writes the network the coordinator
    trained (its own copy, `model = …`), and `predict` uses it; a job that withholds the model
    leaves the parties without one, and only the coordinator's file holds W."""
    assert_ok(deploy, "dbcl-tls", "abc")
    root = deploy["root"]
    models = [ModelFile.load(root / f"dbcl-tls-{p}.npz") for p in "abc"]
    with np.load(root / "dbcl-coordinator.npz") as saved:
        assert str(saved["job_type"]) == "dbcl"
        for model in models:
            assert model.job_type == "dbcl" and model.scaling is not None
            np.testing.assert_array_equal(model.aggregate, saved["theta"])
    _, err = deploy["outcomes"][("dbcl-tls", "a")]
    assert "round 5: sketched gradient on 8 labeled rows" in err
    out = root / "dbcl-pred.csv"
    res = cli("xclp-client", "predict", "--model", str(root / "dbcl-tls-a.npz"), "--data", str(root / "queries.csv"),
              "--id-column", "row_id", "--out", str(out))
    assert res.returncode == 0, res.stderr
    from xclp.data.tables import load
    queries = load(root / "queries.csv", label_column=None, id_column="row_id")
    with open(out) as fh:
        got = [int(r["prediction"]) for r in csv.DictReader(fh)]
    assert got == models[0].loaded().network.predict(models[0].features(queries)).tolist()

    assert_ok(deploy, "dbcl-withheld", "abc")
    _, err = deploy["outcomes"][("dbcl-withheld", "b")]
    assert "withholds the model" in err
    assert not any((root / f"dbcl-withheld-{p}.npz").exists() for p in "abc")
    with np.load(root / "dbcl-withheld.npz") as saved:
        assert list(saved["sizes"]) == [D, 64, 3] and saved["theta"].shape == (D * 64 + 64 + 64 * 3 + 3,)
