"""The party's settings files fail loudly with what to fix (DESIGN §9)."""

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
