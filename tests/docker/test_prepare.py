"""What scripts/docker-prepare and `docker compose up` leave on the machine (docs/docker.md): the
base image under the project's own name, never an official image's; no builder image and no cache
in the checkout; and an `up` without an image that stops at once, names the script, and creates
no network or volume."""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from pathlib import Path

import pytest

from tests.docker.conftest import BASE_IMAGE, REPO, Prepared
from tests.docker.test_compose import COMPOSE
from tests.docker.test_image import docker

pytestmark = pytest.mark.docker

PREPARE = str(REPO / "scripts" / "docker-prepare")
IMPORT_MESSAGE = "scripts/docker-prepare"  # in the Comment of the base image it imports


def tags_of_images_made_here() -> dict[str, str]:
    """Every tag on the engine whose image docker-prepare imported (its Comment names the script)."""
    made: dict[str, str] = {}
    for line in docker("images", "--format", "{{.Repository}}:{{.Tag}}").stdout.split():
        if line.endswith(":<none>"):
            continue
        comment = docker("image", "inspect", "--format", "{{.Comment}}", line).stdout
        if IMPORT_MESSAGE in comment:
            made[line] = comment.strip()
    return made


def test_the_base_image_has_the_projects_own_name_and_no_official_one(prepared: Prepared) -> None:
    """docker-prepare tagged its debootstrap image python:3.11-slim-bookworm, the official image's
    name, which every other project on the machine then built on."""
    made = tags_of_images_made_here()
    assert BASE_IMAGE in made, (BASE_IMAGE, made)
    assert all(tag.startswith("xclp") for tag in made), made
    # The final image is built on it (the Dockerfile's FROM), with its source digest as a label.
    labels = json.loads(docker("image", "inspect", "--format", "{{json .Config.Labels}}", prepared.image).stdout)
    assert len(labels["io.xclp.source-digest"]) == 64


def test_prepare_keeps_no_builder_image_and_writes_nothing_into_the_checkout_but_env(prepared: Prepared) -> None:
    builders = docker("images", "--quiet", "--filter", "label=io.xclp.build-stage=builder").stdout.split()
    assert builders == []
    assert not (REPO / "wheelhouse").exists() and not (REPO / ".docker-cache").exists()
    assert f"XCLP_IMAGE={prepared.image}" in (REPO / ".env").read_text().splitlines()
    assert "outside the checkout" in prepared.said and "--remove" in prepared.said, prepared.said


def test_a_rerun_on_the_same_sources_keeps_the_image_as_it_is(prepared: Prepared) -> None:
    before = docker("image", "inspect", "--format", "{{.Id}}", prepared.image).stdout
    env = {**os.environ, "IMAGE": prepared.image, "BASE_IMAGE": BASE_IMAGE}
    done = subprocess.run([PREPARE], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "is built from these sources and wheels: kept" in done.stderr, done.stderr[-3000:]
    assert docker("image", "inspect", "--format", "{{.Id}}", prepared.image).stdout == before


def test_a_missing_base_of_another_name_is_refused_not_built_under_that_name(tmp_path: Path) -> None:
    name = f"python:3.11-missing-{uuid.uuid4().hex[:6]}"
    env = {**os.environ, "BASE_IMAGE": name, "XCLP_DOCKER_CACHE": str(tmp_path / "cache")}
    done = subprocess.run([PREPARE], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert f"BASE_IMAGE={name} is not on this engine" in done.stderr and "a name of its own" in done.stderr
    assert docker("image", "inspect", name, check=False).returncode != 0
    assert not (tmp_path / "cache").exists()


def test_compose_up_without_an_image_stops_at_once_naming_the_script_and_leaves_nothing(tmp_path: Path) -> None:
    """`up` without the image failed deep in a build ("lookup registry-1… no such host") and left
    11 volumes and a network behind."""
    project = f"xclp-test-{uuid.uuid4().hex[:10]}"
    empty_env = tmp_path / "empty.env"  # not the checkout's .env, which docker-prepare wrote
    empty_env.write_text("")
    env = {k: v for k, v in os.environ.items() if k != "XCLP_IMAGE"}
    done = subprocess.run([*COMPOSE, "-f", str(REPO / "docker-compose.yml"), "--env-file", str(empty_env),
                           "-p", project, "up"], capture_output=True, text=True, timeout=120, env=env, cwd=REPO)
    try:
        assert done.returncode != 0
        said = done.stdout + done.stderr
        assert "XCLP_IMAGE" in said and "Run scripts/docker-prepare first" in said, said[-2000:]
        label = f"label=com.docker.compose.project={project}"
        assert docker("volume", "ls", "-q", "--filter", label).stdout.split() == []
        assert docker("network", "ls", "-q", "--filter", label).stdout.split() == []
        assert docker("ps", "-aq", "--filter", label).stdout.split() == []
    finally:
        subprocess.run([*COMPOSE, "-f", str(REPO / "docker-compose.yml"), "-p", project, "down", "-v"],
                       capture_output=True, timeout=120, env={**env, "XCLP_IMAGE": "xclp:dev"}, cwd=REPO)
