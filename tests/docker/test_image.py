"""The xclp Docker image (Dockerfile, scripts/docker-prepare): one image for both roles.

The session fixture `image` (conftest.py) runs scripts/docker-prepare, so a fresh machine builds
the base image, the wheelhouse and the image itself, offline from any registry. Every container
and volume a test creates carries a unique name and is removed afterwards, also when it fails.
"""

from __future__ import annotations

import io
import json
import re
import subprocess
import tarfile
import time
import uuid
from collections.abc import Iterable, Iterator
from typing import IO, Any

import pytest

from tests.docker.conftest import BASE_IMAGE

NON_ROOT_UID = "10001"

# PEM private keys of every flavour (PKCS#8, RSA, EC, OpenSSH, encrypted): the BEGIN line, up to
# three header lines (Proc-Type, DEK-Info, blank), then a base64 line. The body is required because
# libraries carry the bare marker as a constant (cryptography's ssh.py parser does).
PRIVATE_KEY_PEM = re.compile(rb"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY-----\r?\n"
                             rb"(?:[^\n]{0,100}\n){0,3}[A-Za-z0-9+/]{40}")
# Directories that would mean the build context (or a builder stage) leaked into the image.
LEAKED_DIRS = frozenset({".venv", ".git", "wheelhouse", ".docker-cache", "tests", "benchmarks"})
LEAKED_TOP_DIRS = frozenset({"src", "build"})  # where the builder stage keeps sources and wheels
# Inside site-packages only top-level names count: third-party packages ship their own `tests`.
SITE_PACKAGES = "opt/xclp/venv/lib/python3.11/site-packages/"


def docker(*args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout)
    if check and done.returncode != 0:
        raise AssertionError(f"docker {' '.join(args)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}")
    return done


def find_private_keys_and_leaks(tar_stream: IO[bytes]) -> list[str]:
    """Names of files in a filesystem tarball that hold a PEM private key or come from a build context."""
    found: list[str] = []
    with tarfile.open(fileobj=tar_stream, mode="r|") as tar:
        for member in tar:
            name = member.name.removeprefix("./")
            parts = name.split("/")
            dirs = parts if member.isdir() else parts[:-1]
            if name.startswith(SITE_PACKAGES):
                dirs = dirs[len(SITE_PACKAGES.split("/")) - 1:][:1]
            if LEAKED_DIRS.intersection(dirs) or (dirs and dirs[0] in LEAKED_TOP_DIRS):
                found.append(f"{name} (build-context directory)")
            if not member.isfile():
                continue
            fh = tar.extractfile(member)
            assert fh is not None
            tail = b""
            while chunk := fh.read(1 << 20):
                if PRIVATE_KEY_PEM.search(tail + chunk):
                    found.append(f"{name} (PEM private key)")
                    break
                tail = chunk[-512:]  # a key split across two chunks
    return found


class Resources:
    """Docker containers and volumes one test created, removed at teardown whatever happened."""

    def __init__(self) -> None:
        self.containers: list[str] = []
        self.volumes: list[str] = []

    def name(self, kind: str) -> str:
        name = f"xclp-test-{kind}-{uuid.uuid4().hex[:10]}"
        (self.volumes if kind == "volume" else self.containers).append(name)
        return name

    def cleanup(self) -> None:
        for container in self.containers:
            docker("rm", "--force", "--volumes", container, check=False)
        for volume in self.volumes:
            docker("volume", "rm", "--force", volume, check=False)


@pytest.fixture
def resources() -> Iterator[Resources]:
    made = Resources()
    try:
        yield made
    finally:
        made.cleanup()


def inspect(ref: str) -> dict[str, Any]:
    return json.loads(docker("inspect", ref).stdout)[0]


# --- the scanner itself (no Docker needed) --------------------------------------------------------


def _tarball(files: Iterable[tuple[str, bytes]]) -> io.BytesIO:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in files:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    buf.seek(0)
    return buf


def test_scanner_finds_planted_keys_and_context_leaks() -> None:
    body = b"MC4CAQAwBQYDK2VwBCIEIJ+7hWKq1HnE3zQ5dYQvGZ0RrBvX4Xb6lJt9b0J8aD3C\n"
    big_prefix = b"x" * ((1 << 20) - 10)  # the key straddles the 1 MiB read boundary
    files = [
        ("./etc/ssl/certs/ca.pem", b"-----BEGIN CERTIFICATE-----\n" + body + b"-----END CERTIFICATE-----\n"),
        ("./usr/lib/ssh_parser.py", b'_SK_START = b"-----BEGIN OPENSSH PRIVATE KEY-----"\n' + body),
        ("./srv/a/server-key.pem", b"-----BEGIN PRIVATE KEY-----\n" + body + b"-----END PRIVATE KEY-----\n"),
        ("./srv/b/id_ed25519", b"-----BEGIN OPENSSH PRIVATE KEY-----\r\n" + body),
        ("./srv/c/blob.bin", big_prefix + b"-----BEGIN RSA PRIVATE KEY-----\nProc-Type: 4,ENCRYPTED\n"
         b"DEK-Info: AES-256-CBC,0123456789ABCDEF\n\n" + body),
        ("./src/.venv/pyvenv.cfg", b"home = /usr/bin\n"),
        ("./opt/xclp/venv/lib/python3.11/site-packages/grpc/tests/x.py", b"pass\n"),
        ("./opt/xclp/venv/lib/python3.11/site-packages/tests/test_lsh.py", b"pass\n"),
        ("./build/numpy-2.4.6-cp311-cp311-manylinux_2_28_x86_64.whl", b"PK"),
    ]
    found = find_private_keys_and_leaks(_tarball(files))
    assert found == [
        "srv/a/server-key.pem (PEM private key)",
        "srv/b/id_ed25519 (PEM private key)",
        "srv/c/blob.bin (PEM private key)",
        "src/.venv/pyvenv.cfg (build-context directory)",
        "opt/xclp/venv/lib/python3.11/site-packages/tests/test_lsh.py (build-context directory)",
        "build/numpy-2.4.6-cp311-cp311-manylinux_2_28_x86_64.whl (build-context directory)",
    ]


# --- the image ------------------------------------------------------------------------------------


@pytest.mark.docker
def test_image_defaults_to_the_non_root_user_and_a_coordinator_healthcheck(image: str) -> None:
    config = inspect(image)["Config"]
    assert config["User"] == f"{NON_ROOT_UID}:{NON_ROOT_UID}"
    assert config["WorkingDir"] == "/var/lib/xclp"
    assert config["Healthcheck"]["Test"] == ["CMD", "/opt/xclp/venv/bin/python", "/opt/xclp/healthcheck.py"]
    assert not config.get("Entrypoint"), "no ENTRYPOINT: the command must be the whole xclp-server/xclp-client call"


@pytest.mark.docker
@pytest.mark.parametrize(("cli", "subcommands"), [
    ("xclp-server", ("serve", "ca", "cert")),
    ("xclp-client", ("keygen", "run", "predict", "query")),
])
def test_both_clis_answer_help_as_non_root(image: str, cli: str, subcommands: tuple[str, ...]) -> None:
    out = docker("run", "--rm", image, "sh", "-c", f'id -u && exec {cli} --help').stdout
    uid, _, help_text = out.partition("\n")
    assert uid == NON_ROOT_UID != "0"
    assert help_text.startswith(f"usage: {cli}")
    for sub in subcommands:
        assert sub in help_text


def scan_image(ref: str, resources: Resources) -> set[str]:
    container = resources.name("scan")
    docker("create", "--name", container, ref)
    with subprocess.Popen(["docker", "export", container], stdout=subprocess.PIPE) as export:
        assert export.stdout is not None
        found = find_private_keys_and_leaks(export.stdout)
    assert export.returncode == 0
    return set(found)


@pytest.mark.docker
def test_image_holds_no_private_keys_and_nothing_of_the_build_context(image: str, resources: Resources) -> None:
    # Debian's own files may embed published test keys (libgnutls carries its self-test keys), so
    # the claim is about what the xclp layers add on top of the base image.
    base = scan_image(BASE_IMAGE, resources)
    assert scan_image(image, resources) - base == set()


@pytest.mark.docker
def test_healthcheck_reports_a_coordinator_healthy_once_it_serves(image: str, resources: Resources) -> None:
    volume = resources.name("volume")
    docker("volume", "create", volume)
    mount = f"{volume}:/var/lib/xclp"
    # Certificates, identities and a job made with the image's own helpers, inside the volume only.
    setup = """set -e
xclp-server ca init --dir ca
xclp-server cert server --ca-dir ca --out certs --dns localhost --ip 127.0.0.1
{ echo '[parties]'; xclp-client keygen --party hospital-a --out keys
  xclp-client keygen --party hospital-b --out keys; } > allow.toml
printf '%s\\n' 'job_id = "flynn-smoke"' 'type = "flynn"' 'expected_parties = ["hospital-a", "hospital-b"]' \
    '[params]' 'n_classes = 2' 'm = 64' 's = 4' 'rho = 8' > job.toml
id -u; stat -c %u .
"""
    owners = docker("run", "--rm", "-v", mount, image, "sh", "-c", setup).stdout.split()
    assert owners == [NON_ROOT_UID, NON_ROOT_UID], "a fresh volume at /var/lib/xclp must belong to the xclp user"

    coordinator = resources.name("coordinator")
    docker("run", "--detach", "--name", coordinator, "-v", mount,
           "--health-interval", "1s", "--health-timeout", "5s", "--health-retries", "2",
           image, "xclp-server", "serve", "--listen", "0.0.0.0:50051", "--allow-list", "allow.toml",
           "--job", "job.toml", "--tls-cert", "certs/server.pem", "--tls-key", "certs/server-key.pem")
    status = ""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        state = inspect(coordinator)["State"]
        status = state["Health"]["Status"]
        if status == "healthy" or not state["Running"]:
            break
        time.sleep(0.5)
    logs = docker("logs", coordinator).stderr
    assert status == "healthy", f"health {status!r}; coordinator log:\n{logs}"
    assert "listening on port 50051 (TLS)" in logs

    # The check asks the gRPC health service over verified TLS (the volume's ca/ca.pem): pointed at a
    # closed port, or expecting another name than the certificate's, it fails and says why.
    probe = ["/opt/xclp/venv/bin/python", "/opt/xclp/healthcheck.py"]
    wrong = docker("exec", "--env", "XCLP_HEALTH_PORT=50052", coordinator, *probe, check=False)
    assert wrong.returncode == 1
    assert "coordinator on port 50052 does not answer the gRPC health check: UNAVAILABLE" in wrong.stderr
    misnamed = docker("exec", "--env", "XCLP_HEALTH_SERVER_NAME=elsewhere.example", coordinator, *probe, check=False)
    assert misnamed.returncode == 1 and "does not answer the gRPC health check" in misnamed.stderr


@pytest.mark.docker
def test_healthcheck_passes_in_a_party_container_which_has_no_port(image: str) -> None:
    done = docker("run", "--rm", image, "/opt/xclp/venv/bin/python", "/opt/xclp/healthcheck.py", check=False)
    assert (done.returncode, done.stderr) == (0, "")


@pytest.mark.docker
def test_a_build_that_cannot_reach_the_package_index_says_to_run_docker_prepare(image: str, tmp_path) -> None:
    """`docker compose up` without the image builds it from the package index; offline that failed
    after 30 lines with no word of scripts/docker-prepare. The base image is the one the
    `image` fixture made; the build has no network."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    context = tmp_path / "context"
    context.mkdir()
    for name in ("Dockerfile", "pyproject.toml", "README.md"):
        (context / name).write_bytes((root / name).read_bytes())
    tag = f"xclp-offline-test-{uuid.uuid4().hex[:8]}"
    done = docker("build", "--force-rm", "--network", "none", "--target", "builder", "--build-arg",
                  f"BASE_IMAGE={BASE_IMAGE}", "--build-arg", "WHEELHOUSE=0", "-t", tag, str(context), timeout=600,
                  check=False)
    docker("image", "rm", "-f", tag, check=False)
    # the failed build's layers up to the failing step stay behind as untagged images (--force-rm
    # removes its container): removed, so that the test leaves the engine as it found it
    docker("image", "prune", "--force", "--filter", "label=io.xclp.build-stage=builder", check=False)
    said = done.stdout + done.stderr
    assert done.returncode != 0
    assert "run scripts/docker-prepare" in said and "from Debian packages and a local wheelhouse" in said, said[-3000:]
