"""The documentation site builds with `mkdocs build --strict` (a broken link, a page missing from
the navigation or an API reference that names nothing fails it), its CLI reference page shows the
programs' own --help, and the README's links point at files that exist."""

from __future__ import annotations

import html
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    # as in a fresh clone: the hook must make the API sources before mkdocstrings looks for them
    shutil.rmtree(ROOT / "build" / "api-src", ignore_errors=True)
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert done.returncode == 0, done.stderr[-4000:]
    return out


def test_the_site_builds_strictly_with_every_page(site: Path) -> None:
    pages = {p.relative_to(ROOT / "docs").with_suffix("") for p in (ROOT / "docs").rglob("*.md")}
    built = {p.parent.relative_to(site) for p in site.rglob("index.html")}
    assert {Path(str(p).removesuffix("/index")) if p.name != "index" else Path(".") for p in pages} <= built


def test_the_sites_cli_reference_shows_the_programs_own_help(site: Path) -> None:
    text = html.unescape(re.sub(r"<[^>]+>", "", (site / "cli" / "index.html").read_text()))
    env = {**os.environ, "COLUMNS": "100"}
    for argv in (["xclp-client", "run", "--help"], ["xclp-server", "job", "submit", "--help"]):
        shown = subprocess.run([Path(sys.executable).parent / argv[0], *argv[1:]], capture_output=True, text=True,
                               env=env, timeout=60, check=True).stdout
        for line in shown.splitlines():
            assert line.strip() in text, f"{' '.join(argv)}: {line!r} is not on the site's CLI page"


def test_the_api_reference_renders_the_docstrings(site: Path) -> None:
    text = html.unescape(re.sub(r"<[^>]+>", "", (site / "api" / "index.html").read_text()))
    for shown in ("Take part in one run of", "What a run gave this party", "Run job over parties",
                  "The one error hierarchy", "PolicyRefused"):
        assert shown in text, shown


def test_the_readmes_links_point_at_files_that_exist() -> None:
    links = re.findall(r"\]\(([^)#]+)\)", (ROOT / "README.md").read_text())
    assert len(links) > 10
    missing = [link for link in links if not link.startswith("http") and not (ROOT / link).exists()]
    assert missing == []
