"""Shared test setup: the `docker` marker runs only when a Docker Engine answers."""

from __future__ import annotations

import functools
import shutil
import subprocess

import pytest


@functools.cache
def docker_available() -> bool:
    if shutil.which("docker") is None:
        return False
    try:
        return subprocess.run(["docker", "info"], capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:  # the Docker end-to-end tests are slow ones: the fast lane (-m "not slow") leaves them out
        if item.get_closest_marker("docker") is not None:
            item.add_marker(pytest.mark.slow)
    if any("docker" in item.keywords for item in items) and not docker_available():
        skip = pytest.mark.skip(reason="no Docker Engine answers `docker info`")
        for item in items:
            if "docker" in item.keywords:
                item.add_marker(skip)


@pytest.fixture(scope="session")
def keys() -> dict[str, object]:
    """Ed25519 identity keys of parties a, b, c, d and of an outsider, mallory."""
    from xclp.crypto import identity

    return {p: identity.generate_identity() for p in ("a", "b", "c", "d", "mallory")}


@pytest.fixture(scope="session", autouse=True)
def _release_logs_in_a_temporary_directory(tmp_path_factory: pytest.TempPathFactory):
    """`xclp-client run` keeps its privacy ledger under $XDG_STATE_HOME (client/ledger.py): the
    tests' CLI runs keep theirs out of the user's home."""
    import os

    before = os.environ.get("XDG_STATE_HOME")
    os.environ["XDG_STATE_HOME"] = str(tmp_path_factory.mktemp("xdg-state"))
    yield
    if before is None:
        os.environ.pop("XDG_STATE_HOME", None)
    else:
        os.environ["XDG_STATE_HOME"] = before

