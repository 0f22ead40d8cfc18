"""`xclp-server federation new`: the scaffold plus four commands — the coordinator and
three parties, as its README says — run a real XCLP job on three CSVs this test writes, and every
party gets its predictions; one of them with `--validate`, whose comparison an independent computation
confirms. And `allow add`, for real federations."""

from __future__ import annotations

import contextlib
import os
import shlex
import subprocess
import sys
import threading
import tomllib
from pathlib import Path

import numpy as np
import pytest

from tests.dask_cluster import cluster
from tests.helpers import make_data, write_table
from xclp.baselines import logistic_baseline, per_client_lp
from xclp.crypto import identity
from xclp.errors import ConfigError, InvalidInput
from xclp.server.config import load_job
from xclp.server.federation import allow_add, new_federation
from xclp.validation import hold_out, wilson

BIN = Path(sys.executable).parent
PARTIES = ("north", "south", "east")


def tables(root: Path) -> list[Path]:
    paths = []
    for i, p in enumerate(PARTIES):
        X, y = make_data(i, n=40, d=6, unlabeled=10)
        paths.append(root / f"{p}.csv")
        write_table(paths[-1], X, y, [f"{p}-{k}" for k in range(40)], label_column="diagnosis")
    return paths


@pytest.mark.slow
@pytest.mark.parametrize("offload", [False, True], ids=["alone", "dask-cluster"])
def test_the_scaffold_and_the_four_commands_of_its_readme_run_xclp_on_three_csvs(tmp_path, offload) -> None:
    """With `offload`, the coordinator's server.toml also names a Dask scheduler of the operator's
    (mutual TLS, the Dask way: environment variables), where its influence solve runs."""
    fed = tmp_path / "fed"
    made = subprocess.run([str(BIN / "xclp-server"), "federation", "new", str(fed), "--parties", ",".join(PARTIES),
                           "--data", *map(str, tables(tmp_path)), "--label-column", "diagnosis", "--id-column",
                           "row_id"], capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, made.stderr
    commands = [line.split("  #")[0].strip() for line in made.stdout.splitlines() if line.strip()]
    assert len(commands) == 4 and commands[0].startswith("xclp-server serve --config")
    assert commands == [line.split("  #")[0].strip() for line in
                        (fed / "README.md").read_text().split("```sh\n")[1].split("```")[0].splitlines()]
    for p in PARTIES:
        assert (fed / p / f"{p}.key").stat().st_mode & 0o777 == 0o600
    assert (fed / "ca" / "ca-key.pem").stat().st_mode & 0o777 == 0o600
    job = (fed / "coordinator" / "xclp.toml").read_text()
    assert "n_classes = 3" in job and "min_parties = 2" in job
    assert 'columns = ["f0", "f1", "f2", "f3", "f4", "f5"]' in job  # the job's schema
    assert 'id_column = "row_id"' in job  # which every party checks, and simulate reads by
    # 2048-bit keys are the scaffold's default; a test uses small ones, as the docs' quick trials do
    (fed / "coordinator" / "xclp.toml").write_text(job.replace("key_bits = 2048", "key_bits = 512\n"
                                                               "insecure_test_keys = true"))
    for p in PARTIES:
        run = fed / p / "run.toml"
        run.write_text(run.read_text().replace("paillier_bits = 2048", "paillier_bits = 512\n"
                                               "insecure_test_keys = true\nworkers = 0"))
    dask = contextlib.ExitStack()
    env, workers = dict(os.environ), ""
    if offload:
        pytest.importorskip("distributed")
        (tmp_path / "dask").mkdir()
        running = dask.enter_context(cluster(tmp_path / "dask", workers=2))
        env.update({"DASK_" + key.upper().replace(".", "__").replace("-", "_"): value
                    for key, value in running.client_config().items()})
        workers = f'workers = "{running.address}"\n'
    (fed / "coordinator" / "server.toml").write_text((fed / "coordinator" / "server.toml").read_text().replace(
        "127.0.0.1:50051", "127.0.0.1:0").replace("[tls]", f'port_file = "port"\nadmin_listen = "off"\n{workers}[tls]'))
    procs = []
    try:
        server = subprocess.Popen([str(BIN / c) if i == 0 else c for i, c in enumerate(shlex.split(commands[0]))],
                                  stderr=subprocess.PIPE, text=True, env=env)
        procs.append(server)
        port_file = fed / "coordinator" / "port"
        for _ in range(600):
            if port_file.exists() and port_file.read_text().strip():
                break
            assert server.poll() is None, server.stderr.read() if server.stderr else ""
            threading.Event().wait(0.1)
        port = port_file.read_text().strip()
        for command in commands[1:]:
            args = shlex.split(command)
            # north also asks whether federating helps it (--validate): a third of its labels held out
            extra = ["--validate", "0.3"] if f"{PARTIES[0]}/run.toml" in command else []
            procs.append(subprocess.Popen([str(BIN / args[0]), *args[1:], "--coordinator", f"localhost:{port}",
                                           *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        outs = {i: proc.communicate(timeout=300) for i, proc in enumerate(procs)}
        said = {i: out[1] for i, out in outs.items()}
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
        dask.close()
    assert all(proc.returncode == 0 for proc in procs), said
    assert ("influence columns solved" in said[0]) and (f"on the Dask scheduler {running.address}" in said[0]
                                                        if offload else "Dask" not in said[0])
    for p in PARTIES:
        predictions = (fed / p / "out" / "predictions.csv").read_text().splitlines()
        assert len(predictions) == 41 and predictions[1].startswith(f"{p}-0,")
        assert predictions[0].startswith("row_id,label,confidence,")  # the table's name for its id column
    # --validate: its table, with numbers an independent computation gives on the same held-out rows
    north = next(out for i, out in outs.items() if i and "held out" in out[0])[0]
    X, y = make_data(0, n=40, d=6, unlabeled=10)
    held = hold_out(y, 0.3, PARTIES[0], "xclp/validate-holdout")
    hidden = y.copy()
    hidden[held] = -1
    params = load_job(fed / "coordinator" / "xclp.toml").params
    alone = per_client_lp(X, hidden, params.n_classes, params.graph_params, params.normalise_labels).labels
    rows = [line.split(",") for line in (fed / PARTIES[0] / "out" / "predictions.csv").read_text().splitlines()[1:]]
    federated = np.array([int(r[1]) for r in rows])
    local = logistic_baseline(X, hidden, params.n_classes)

    def cell(hits: np.ndarray) -> str:  # an accuracy and its 95 % Wilson interval, as the table prints it
        low, high = wilson(float(np.mean(hits)), hits.size)
        return f"{np.mean(hits):.3f} [{low:.2f}, {high:.2f}]"

    expected = (f"{PARTIES[0]:<16}{held.size:>9}  {cell(alone[held] == y[held]):<20}"
                f"{cell(federated[held] == y[held]):<20}{cell(local[held] == y[held])}")
    assert north.splitlines()[1] == expected, north
    assert held.size == 9 and "pooled" not in north


def test_the_scaffold_refuses_tables_whose_columns_differ_and_a_directory_in_use(tmp_path) -> None:
    paths = tables(tmp_path)
    X, y = make_data(9, n=20, d=5, unlabeled=2)
    write_table(paths[2], X, y, [f"e-{k}" for k in range(20)], label_column="diagnosis")
    with pytest.raises(InvalidInput, match="east.csv has the feature columns .*: every party needs the same columns"):
        new_federation(tmp_path / "fed", PARTIES, paths, label_column="diagnosis", id_column="row_id")
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "x").write_text("")
    with pytest.raises(ConfigError, match="is not empty"):
        new_federation(tmp_path / "used", PARTIES)


def test_allow_add_puts_a_keygen_line_in_the_allow_list_and_refuses_a_second_key_or_a_bad_one(tmp_path) -> None:
    allow = tmp_path / "allow.toml"
    a, b = identity.generate_identity(), identity.generate_identity()
    allow_add(allow, "a", identity.public_key_text(a))
    allow_add(allow, "b", f'b = "{identity.public_key_text(b)}"')  # the whole line keygen prints
    listed = identity.allow_list(tomllib.loads(allow.read_text())["parties"])
    assert listed == {"a": identity.public_bytes(a), "b": identity.public_bytes(b)}
    with pytest.raises(ConfigError, match="already lists 'a'; pass --replace"):
        allow_add(allow, "a", identity.public_key_text(b))
    with pytest.raises(ConfigError, match="another party"):
        allow_add(allow, "c", identity.public_key_text(a))
    with pytest.raises(ConfigError, match="must start with 'ed25519:'"):
        allow_add(allow, "c", "rsa:AAAA")
    allow_add(allow, "a", identity.public_key_text(identity.generate_identity()), replace=True)
    assert len(tomllib.loads(allow.read_text())["parties"]) == 2


def test_the_scaffold_proposes_what_the_tables_need_and_its_job_runs_without_edits(tmp_path, capsys) -> None:
    """Scales a thousandfold apart, an empty cell and a text column: the scaffold wrote none of
    `standardise`, `impute` or `[params.categorical]` (results then swung from seed to seed, the run
    failed on the empty cell, and the text column's error named no fix). It now proposes each, says
    why, and the job it writes runs on the tables as they are."""
    from xclp.simulation import simulate

    rng = np.random.default_rng(4)
    paths = []
    for i, p in enumerate(PARTIES):
        y = rng.integers(0, 2, size=30)
        lines = ["row_id,age,income,smoker,label"]
        for k in range(30):
            income = "" if (i, k) == (1, 3) else f"{50000 + 20000 * y[k] + rng.normal() * 5000:.0f}"
            smoker = ["Yes", "No"][int(rng.random() < 0.3 + 0.4 * y[k])]
            label = "" if k % 3 == 0 else str(int(y[k]))
            lines.append(f"{p}-{k},{40 + 10 * y[k] + rng.normal() * 5:.1f},{income},{smoker},{label}")
        paths.append(tmp_path / f"{p}.csv")
        paths[-1].write_text("\n".join(lines) + "\n")
    said: list[str] = []
    new_federation(tmp_path / "fed", PARTIES, paths, label_column="label", id_column="row_id", say=said.append)
    assert any("column 'smoker' holds text: declared categorical with its 2 levels (No, Yes)" in s for s in said)
    assert any('1 empty feature cells (in income): impute = "mean"' in s for s in said)
    assert any("scales differ" in s and "standardise = true" in s for s in said)
    job_path = tmp_path / "fed" / "coordinator" / "xclp.toml"
    job = load_job(job_path)
    assert job.params.categorical == {"smoker": ("No", "Yes")} and job.params.impute == "mean"
    assert job.params.standardise and job.params.columns == ("age", "income", "smoker")
    sim = simulate(job_path, dict(zip(PARTIES, paths)), id_column="row_id", secure=False)  # no edits
    assert all(len(sim[p].predictions()) == 30 for p in PARTIES)
