"""What both executables need from the machine they run on: atomic files, strict TOML, test hooks.

- `write_atomic`: a temp file in the target's directory, fsync, chmod, rename — a reader sees the
  old file or the whole new one, never half of it (docs/design.md §5.7, §9). Mode 0600 unless asked.
- `write_private` / `read_bytes`: key files (the crypto layer takes and gives bytes only).
- `read_toml` / `check_keys`: a settings file that does not parse, or names a key we do not know,
  is an error naming the file, never silently ignored.
- `require_testing`: test hooks (they write secrets or what the coordinator learned to disk) are
  refused unless `XCLP_TESTING=1` is set in the environment.
"""

from __future__ import annotations

import json
import os
import tempfile
import tomllib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from xclp.errors import ConfigError

TESTING_ENV = "XCLP_TESTING"


def write_atomic(path: str | os.PathLike[str], data: bytes, *, mode: int = 0o600) -> Path:
    path = Path(path)
    directory = path.parent if str(path.parent) else Path(".")
    directory.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=directory)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_private(path: str | os.PathLike[str], data: bytes, *, overwrite: bool = False) -> Path:
    """A private key file, readable by the owner only (mode 0600), never written through a symbolic
    link planted at `path`, and (unless `overwrite`) never over an existing file."""
    path = Path(path)
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | (os.O_TRUNC if overwrite else os.O_EXCL)
    try:
        fd = os.open(path, flags, 0o600)
    except FileExistsError:
        raise ConfigError(f"{path} already exists; refusing to overwrite a private key") from None
    except OSError as exc:
        if os.path.islink(path):
            raise ConfigError(f"{path} is a symbolic link; refusing to write a private key through it") from None
        raise ConfigError(f"cannot write {path}: {exc.strerror}") from None
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    os.chmod(path, 0o600)  # O_CREAT's mode is masked by umask and ignored for existing files
    return path


def read_bytes(path: str | os.PathLike[str], what: str) -> bytes:
    """A file's bytes, or ConfigError naming `what` it should have been and why it cannot be read."""
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read {what} {path}: {exc.strerror}") from None


def write_json_atomic(path: str | os.PathLike[str], data: Any, *, mode: int = 0o600) -> Path:
    return write_atomic(path, (json.dumps(data, indent=2, sort_keys=True) + "\n").encode(), mode=mode)


def read_toml(path: str | os.PathLike[str]) -> dict[str, Any]:
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path} is not valid TOML: {exc}") from None


def check_keys(path: str | os.PathLike[str], raw: dict[str, Any], known: Iterable[str]) -> None:
    """Refuse keys of a settings file that we do not know, listing the ones we do."""
    known = set(known)
    extra = sorted(set(raw) - known)
    if extra:
        raise ConfigError(f"{path}: unknown key(s) {', '.join(extra)}; known: {', '.join(sorted(known))}")


def testing_enabled() -> bool:
    return os.environ.get(TESTING_ENV) == "1"


def require_testing(what: str) -> None:
    """Refuse a test hook (`what` says what it would do) unless XCLP_TESTING=1."""
    if not testing_enabled():
        raise ConfigError(f"{what}; it is a test hook and refused unless {TESTING_ENV}=1 is set")


def default_workers() -> int:
    """The cores this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)
