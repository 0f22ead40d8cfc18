"""The party's settings files fail loudly with what to fix (docs/design.md §9)."""

from __future__ import annotations

import pytest

from xclp.client.cli import _read_party_toml
from xclp.errors import ConfigError


def test_party_toml_resolves_paths_next_to_it_and_refuses_unknown_keys(tmp_path):
    (tmp_path / "p.toml").write_text('coordinator = "h:1"\nidentity = "keys/a.key"\ndata = "d.csv"\ninsecure = true\n')
    cfg = _read_party_toml(tmp_path / "p.toml")
    assert cfg["identity"] == tmp_path / "keys" / "a.key" and cfg["coordinator"] == "h:1" and cfg["insecure"] is True
    (tmp_path / "q.toml").write_text('coordinatr = "h:1"\n')
    with pytest.raises(ConfigError, match="unknown key"):
        _read_party_toml(tmp_path / "q.toml")


def test_run_refuses_a_plain_tcp_dask_scheduler_before_reading_anything_else(tmp_path, capsys):
    """--workers tcp://... would send Paillier tasks (the party's secret key, its codes) in the
    clear: refused with the way out, before the identity key or data are read; --insecure-workers
    lets it past that check (here to the missing identity key)."""
    from xclp.client.cli import main
    from xclp.v1.status import EXIT_BAD_INPUT

    argv = ["run", "--job", "j", "--party", "a", "--identity", str(tmp_path / "none.key"), "--coordinator", "h:1",
            "--data", str(tmp_path / "none.csv"), "--peers", str(tmp_path / "allow.toml"), "--out", str(tmp_path),
            "--workers", "tcp://dask.internal:8786"]
    assert main(argv) == EXIT_BAD_INPUT
    said = capsys.readouterr().err
    assert "--workers tcp://dask.internal:8786" in said and "use tls://" in said and "--insecure-workers" in said
    assert main([*argv, "--insecure-workers"]) == EXIT_BAD_INPUT
    said = capsys.readouterr().err
    assert "in the clear" in said and "cannot read identity key" in said


def test_a_label_column_named_but_missing_is_refused_before_join_and_the_default_missing_is_said_once(
        tmp_path, capsys, keys):
    """`--label-column diagnosis` on a table without it stops before any connection (the
    coordinator address answers nothing), listing the table's columns; without the flag, a table
    with no `label` column runs all unlabeled and says so once, and a job that learns from labels
    says that this party brings none (before Join; here the run then fails to connect)."""
    import numpy as np

    from tests.helpers import save_identity, write_table
    from xclp.client.api import read_data
    from xclp.client.cli import main
    from xclp.crypto import identity
    from xclp.v1.registry import parse_params
    from xclp.v1.status import EXIT_BAD_INPUT

    X = np.arange(12, dtype=float).reshape(4, 3)
    write_table(tmp_path / "t.csv", X, None, ["r0", "r1", "r2", "r3"])
    save_identity(keys["a"], tmp_path / "a.key")
    (tmp_path / "allow.toml").write_text(f'[parties]\na = "{identity.public_key_text(keys["a"])}"\n')
    argv = ["run", "--job", "j", "--party", "a", "--identity", str(tmp_path / "a.key"), "--coordinator",
            "127.0.0.1:9", "--data", str(tmp_path / "t.csv"), "--id-column", "row_id", "--peers",
            str(tmp_path / "allow.toml"), "--out", str(tmp_path / "out.csv"), "--insecure", "--connect-timeout", "0",
            "--label-column", "diagnosis"]
    assert main(argv) == EXIT_BAD_INPUT
    said = capsys.readouterr().err
    assert "has no label column 'diagnosis'; columns: row_id, f0, f1, f2" in said
    assert "not reachable" not in said and "connect" not in said

    lines: list[str] = []
    load = read_data(tmp_path / "t.csv", id_column="row_id", progress=lines.append)
    flynn = parse_params("flynn", {"n_classes": 2, "m": 8, "s": 2, "rho": 2})
    for _ in range(2):
        load(flynn)
    notes = [line for line in lines if "no label column 'label'" in line]
    assert len(notes) == 1 and "every row is unlabeled" in notes[0]
    assert sum("has no labeled row" in line for line in lines) == 1
    race = parse_params("race", {"rows": 4, "width": 4})  # a density of every row: labels are not used
    lines.clear()
    read_data(tmp_path / "t.csv", id_column="row_id", progress=lines.append)(race)
    assert not any("has no labeled row" in line for line in lines)
