"""Files on the machine a party or the coordinator runs on (xclp/runtime.py): key files written
owner-only and never through a planted link, reads that name the file and what it should be."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from xclp.errors import ConfigError
from xclp.runtime import read_bytes, write_private


def test_a_private_key_file_is_owner_only_and_never_overwritten_unless_asked(tmp_path: Path) -> None:
    path = write_private(tmp_path / "a.key", b"secret")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600 and path.read_bytes() == b"secret"
    with pytest.raises(ConfigError, match="refusing to overwrite"):
        write_private(path, b"other")
    assert path.read_bytes() == b"secret"
    os.chmod(path, 0o644)
    write_private(path, b"new", overwrite=True)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600 and path.read_bytes() == b"new"


def test_a_private_key_is_never_written_through_a_symlink(tmp_path: Path) -> None:
    """A link planted where the key goes must not send the private key elsewhere."""
    target = tmp_path / "elsewhere"
    (tmp_path / "a.key").symlink_to(target)
    for overwrite in (False, True):
        with pytest.raises(ConfigError, match="symbolic link|already exists"):
            write_private(tmp_path / "a.key", b"secret", overwrite=overwrite)
    assert not target.exists()


def test_a_missing_file_is_named_with_what_it_should_have_been(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=f"cannot read identity key {tmp_path / 'missing.pem'}: No such file"):
        read_bytes(tmp_path / "missing.pem", "identity key")
