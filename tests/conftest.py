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
