"""The documentation site builds with `mkdocs build --strict` (a broken link, a page missing from
the navigation or an API reference that names nothing fails it), its CLI reference page shows the
programs' own --help, and the README's links point at files that exist. The built site works
without a network: no page loads anything from another host, the diagrams are drawn in the pages
(scripts/sequence_diagram.py), and search works on pages opened from disk (in Chromium, when it
is installed)."""

from __future__ import annotations

import html
import importlib.util
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
    # built for reading from disk (mkdocs.yml, the offline plugin): docs/a/b.md is site/a/b.html
    pages = {p.relative_to(ROOT / "docs").with_suffix(".html") for p in (ROOT / "docs").rglob("*.md")}
    built = {p.relative_to(site) for p in site.rglob("*.html")}
    assert {Path(str(p).replace("README.html", "index.html")) for p in pages} <= built


def test_the_sites_cli_reference_shows_the_programs_own_help(site: Path) -> None:
    text = html.unescape(re.sub(r"<[^>]+>", "", (site / "cli.html").read_text()))
    env = {**os.environ, "COLUMNS": "100"}
    for argv in (["xclp-client", "run", "--help"], ["xclp-server", "job", "submit", "--help"]):
        shown = subprocess.run([Path(sys.executable).parent / argv[0], *argv[1:]], capture_output=True, text=True,
                               env=env, timeout=60, check=True).stdout
        for line in shown.splitlines():
            assert line.strip() in text, f"{' '.join(argv)}: {line!r} is not on the site's CLI page"


def test_the_api_reference_renders_the_docstrings(site: Path) -> None:
    text = html.unescape(re.sub(r"<[^>]+>", "", (site / "api.html").read_text()))
    for shown in ("Take part in one run of", "What a run gave this party", "Run job over parties",
                  "The one error hierarchy", "PolicyRefused"):
        assert shown in text, shown


def test_the_readmes_links_point_at_files_that_exist() -> None:
    links = re.findall(r"\]\(([^)#]+)\)", (ROOT / "README.md").read_text())
    assert len(links) > 10
    missing = [link for link in links if not link.startswith("http") and not (ROOT / link).exists()]
    assert missing == []


def _sequence_diagram():  # scripts/ is not a package: the renderer the mkdocs hook loads, loaded the same way
    spec = importlib.util.spec_from_file_location("sequence_diagram", ROOT / "scripts" / "sequence_diagram.py")
    assert spec is not None and spec.loader is not None
    module = sys.modules["sequence_diagram"] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_no_page_loads_a_script_a_stylesheet_or_a_font_from_another_host(site: Path) -> None:
    fetched = re.compile(r"<script[^>]*\bsrc=\"https?://[^\"]*\"|<link[^>]*\bhref=\"https?://[^\"]*\"[^>]*>")
    for page in site.rglob("*.html"):
        text = page.read_text()
        links = [tag for tag in fetched.findall(text) if 'rel="canonical"' not in tag]
        assert links == [], f"{page.relative_to(site)} loads {links[:3]}"
        # Material fetches mermaid.js from unpkg for any element of class "mermaid"
        assert 'class="mermaid"' not in text, page.relative_to(site)
    assert "unpkg" not in (site / "index.html").read_text()  # the offline plugin's own shim is not used


def test_the_concepts_diagrams_are_drawn_in_the_page_with_every_message(site: Path) -> None:
    source = (ROOT / "docs" / "concepts.md").read_text()
    fences = re.findall(r"^```mermaid\n(.*?)^```", source, re.MULTILINE | re.DOTALL)
    built = (site / "concepts.html").read_text()
    figures = re.findall(r'<figure class="diagram"><svg (.*?)</svg></figure>', built, re.DOTALL)
    assert len(fences) == len(figures) == 4
    for fence, svg in zip(fences, figures):
        drawn = " ".join(html.unescape(t) for t in re.findall(r"<tspan[^>]*>([^<]*)</tspan>", svg))
        for line in fence.splitlines()[1:]:
            said = re.sub(r"^.*?: ", "", line.strip()) if ":" in line else ""
            for word in re.split(r"\s+|<br/>", said):
                assert word in drawn, f"{word!r} of {line.strip()!r} is not in its diagram"
        assert drawn.count("party a") == 1  # each participant's box, once


def test_the_diagram_renderer_refuses_what_it_cannot_draw_by_line() -> None:
    diagrams = _sequence_diagram()
    ok = "sequenceDiagram\n participant A as a\n participant B\n A->>B: hello<br/>there\n Note over A,B: both"
    svg = diagrams.render(ok, "t")
    assert svg.startswith("<svg") and ">hello<" in svg and ">there<" in svg and 'stroke-dasharray="6 4"' not in svg
    assert 'stroke-dasharray="6 4"' in diagrams.render(ok.replace("->>", "-->>"))
    for source, said in [("flowchart LR\n A-->B", "only sequenceDiagram is drawn, not 'flowchart LR'"),
                         ("sequenceDiagram\n participant A\n A->>C: hi", "line 3: 'C' is not a declared participant"),
                         ("sequenceDiagram\n participant A\n A-xA: lost",
                          "line 3: 'A-xA: lost' is not sequenceDiagram"),
                         ("sequenceDiagram\n participant A\n end", "line 3: 'end' without a loop"),
                         ("sequenceDiagram\n participant A\n loop every round", "a loop has no 'end'")]:
        with pytest.raises(diagrams.DiagramError, match=re.escape(said)):
            diagrams.render(source)


@pytest.mark.skipif(shutil.which("chromium") is None, reason="needs Chromium (Debian: apt-get install chromium)")
def test_search_finds_pages_in_the_site_opened_from_disk_without_a_network(site: Path) -> None:
    # every host name fails to resolve: nothing can come from a CDN; file:// forbids Web Workers, so the
    # search runs in docs/assets/iframe-worker-file.js's frame
    page = f"{(site / 'index.html').as_uri()}?q=reconnect"
    chromium = ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--host-resolver-rules=MAP * ~NOTFOUND"]
    done = subprocess.run([*chromium, "--virtual-time-budget=15000", "--dump-dom", page], capture_output=True,
                          text=True, timeout=120)
    found = re.search(r'class="md-search-result__meta">([^<]*)<', done.stdout)
    assert found is not None, done.stderr[-2000:]
    assert re.fullmatch(r"\d+ matching documents", found[1].strip()), found[1]
    assert int(found[1].split()[0]) >= 3
    assert "operating.html" in done.stdout  # the operating page says how a lost connection is resumed


# what a reader of the repository alone cannot follow: a design file outside it, a paper by its
# number in a folder outside it, an issue of a tracker outside it
UNFOLLOWABLE = re.compile(r"\bDESIGN\b|\bpaper 0\d\d\b|\b[Ii]ssues? \d+\b")
DESIGN_SECTION = re.compile(r"docs/design\.md §(\d+)(?:\.(\d+))?")


def _tracked_text() -> dict[str, str]:
    listed = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    out = {}
    for name in listed:
        path = ROOT / name
        text = path.suffix in (".py", ".md", ".toml", ".yml", ".proto", ".pyi") or name == "Dockerfile"
        if text and path.is_file() and not name.endswith(("_pb2.py", "_pb2_grpc.py")):
            out[name] = path.read_text(errors="replace")
    return out


def test_every_reference_in_the_repository_can_be_followed_from_it() -> None:
    """STYLE 7: the code, the docs and the tests cite the project's own design page
    (docs/design.md §N.M, whose section N has an item M), papers by author and year as
    docs/references.md lists them, and no issue numbers."""
    design = (ROOT / "docs" / "design.md").read_text()
    sections = {int(m) for m in re.findall(r"^## (\d+)\. ", design, flags=re.M)}
    found, dangling = [], []
    for name, text in _tracked_text().items():
        if name == "tests/test_docs.py":
            continue
        for number, line in enumerate(text.splitlines(), 1):
            if UNFOLLOWABLE.search(line):
                found.append(f"{name}:{number}: {line.strip()[:100]}")
            for section, _ in DESIGN_SECTION.findall(line):
                if int(section) not in sections:
                    dangling.append(f"{name}:{number}: docs/design.md §{section}")
    assert found == [], "\n".join(found[:20])
    assert dangling == [], "\n".join(dangling[:20])
    references = (ROOT / "docs" / "references.md").read_text()
    for cited in ("Scott et al. 2023", "Ram & Sinha 2022", "Coleman & Shrivastava 2021", "Zhang & Wang 2021"):
        assert cited in references, cited


def test_the_built_api_pages_cite_nothing_a_reader_cannot_follow(site: Path) -> None:
    for page in site.rglob("*.html"):
        text = html.unescape(re.sub(r"<[^>]+>", "", page.read_text()))
        assert not UNFOLLOWABLE.search(text), (page.relative_to(site), UNFOLLOWABLE.search(text))
