"""Shared by the Docker tests: the image, built once per session by scripts/docker-prepare."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
IMAGE = os.environ.get("XCLP_TEST_IMAGE", "xclp:dev")
BASE_IMAGE = os.environ.get("BASE_IMAGE", "xclp-base:bookworm")  # as scripts/docker-prepare


@dataclass(frozen=True)
class Prepared:
    image: str
    said: str  # what scripts/docker-prepare printed (stderr)


@pytest.fixture(scope="session")
def prepared() -> Prepared:
    """Builds (or re-uses) the image offline with scripts/docker-prepare, as a fresh machine would."""
    env = {**os.environ, "IMAGE": IMAGE, "BASE_IMAGE": BASE_IMAGE}
    done = subprocess.run([str(REPO / "scripts" / "docker-prepare")], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=560)  # under pytest-timeout (600 s)
    if done.returncode != 0:
        pytest.fail(f"scripts/docker-prepare failed ({done.returncode}):\n{done.stderr[-4000:]}")
    return Prepared(IMAGE, done.stderr)


@pytest.fixture(scope="session")
def image(prepared: Prepared) -> str:
    return prepared.image
