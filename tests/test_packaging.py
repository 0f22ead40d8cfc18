"""What `pip install xclp` puts into site-packages: one top-level name, every module, the demo data.

The wheel is built from this checkout (no build isolation: the test extra brings setuptools and
wheel) and installed with --target into a temporary folder; the console entry points and a few
deep imports are then run from there, in a working directory where a stray `server.py` sits, with
the checkout off sys.path.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE_DIRS = {"xclp": "xclp", "crypto": "xclp/crypto", "server": "xclp/server", "client": "xclp/client"}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Built from a clean copy of the sources (an in-tree build/ could carry stale modules)."""
    src, out = tmp_path_factory.mktemp("src"), tmp_path_factory.mktemp("wheel")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    for folder in PACKAGE_DIRS:
        shutil.copytree(REPO / folder, src / folder, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                    "--wheel-dir", str(out), str(src)], check=True, capture_output=True, timeout=300)
    (path,) = out.glob("xclp-*.whl")
    return path


def test_the_wheel_installs_one_top_level_name(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert top == {"xclp"}
    with zipfile.ZipFile(wheel) as zf:
        entry_points = zf.read(next(n for n in names if n.endswith(".dist-info/entry_points.txt"))).decode()
    assert "xclp-server = xclp.server.cli:main" in entry_points
    assert "xclp-client = xclp.client.cli:main" in entry_points


def test_the_wheel_holds_every_module_and_the_demo_data(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = set()
    for folder, target in PACKAGE_DIRS.items():
        for path in (REPO / folder).rglob("*"):
            if path.suffix in (".py", ".csv", ".toml", ".pyi") or path.name == "py.typed":
                rel = path.relative_to(REPO / folder).as_posix()
                if folder == "xclp" or not rel.startswith(("crypto/", "server/", "client/")):
                    expected.add(f"{target}/{rel}")
    assert expected - names == set()
    assert "xclp/py.typed" in names
    assert {f"xclp/demo_data/hospital-{p}.csv" for p in "abc"} <= names


def test_the_installed_wheel_runs_outside_the_checkout(wheel: Path, tmp_path: Path) -> None:
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(site), str(wheel)],
                   check=True, capture_output=True, timeout=300)
    work = tmp_path / "work"
    work.mkdir()
    (work / "server.py").write_text("raise SystemExit('the stray server.py ran')\n")
    (work / "crypto.py").write_text("raise SystemExit('the stray crypto.py ran')\n")
    env = {**os.environ, "PYTHONPATH": str(site)}
    code = ("import xclp, xclp.server.cli, xclp.client.cli, xclp.crypto.secure_hamming, xclp.simulation, xclp.demo;"
            "print(xclp.__file__)")
    out = subprocess.run([sys.executable, "-c", code], cwd=work, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().startswith(str(site))
    for main in ("xclp.server.cli", "xclp.client.cli"):
        run = subprocess.run([sys.executable, "-c", f"import sys, {main} as m; sys.argv[0] = 'x'; m.main(['--help'])"],
                             cwd=work, env=env, capture_output=True, text=True, timeout=120)
        assert run.returncode == 0 and "usage:" in run.stdout, run.stderr
