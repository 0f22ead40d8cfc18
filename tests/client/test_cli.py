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
