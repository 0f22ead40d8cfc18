"""MkDocs hooks (mkdocs.yml `hooks`): the installed package's layout for mkdocstrings, and the
diagrams drawn at build time.

xclp.client, xclp.server and xclp.crypto live in the top-level folders client/, server/ and
crypto/ (pyproject.toml package-dir), which griffe's static analysis cannot follow. Before the
build, this hook copies the sources into build/api-src/xclp/ in the installed layout (xclp/, with
client/, server/ and crypto/ inside it), which mkdocs.yml points griffe at. (Symbolic links would
not do: griffe follows them back to the real folders.)
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import sys
from pathlib import Path
from typing import Any

from mkdocs.exceptions import PluginError
from mkdocs.plugins import event_priority

# the diagram renderer beside this file (mkdocs loads hooks by path, not as a package)
_spec = importlib.util.spec_from_file_location("sequence_diagram", Path(__file__).with_name("sequence_diagram.py"))
assert _spec is not None and _spec.loader is not None
sequence_diagram = sys.modules["sequence_diagram"] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sequence_diagram)

SUBPACKAGES = ("client", "server", "crypto")


@event_priority(100)  # before mkdocstrings reads its search paths (it drops those that do not exist yet)
def on_config(config: Any) -> Any:
    root = Path(config.config_file_path).resolve().parent
    tree = root / "build" / "api-src" / "xclp"
    shutil.rmtree(tree, ignore_errors=True)
    sources = shutil.ignore_patterns("__pycache__", "*.pyc", "*.csv")
    shutil.copytree(root / "xclp", tree, ignore=sources)
    for name in SUBPACKAGES:
        shutil.copytree(root / name, tree / name, ignore=sources)
    return config


_MERMAID = re.compile(r"^```mermaid\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    """Each ```mermaid fence drawn as inline SVG (scripts/sequence_diagram.py): the site loads no
    diagram script from a CDN, so its diagrams show without a network. A diagram the renderer
    cannot draw fails the build, naming the page."""
    def draw(match: re.Match[str]) -> str:
        heading = re.findall(r"^#+ (.+)$", markdown[: match.start()], re.MULTILINE)
        title = f"sequence diagram: {heading[-1] if heading else page.title}"
        try:
            return f'<figure class="diagram">{sequence_diagram.render(match[1], title)}</figure>'
        except sequence_diagram.DiagramError as exc:
            raise PluginError(f"{page.file.src_path}: a diagram: {exc}") from None

    return _MERMAID.sub(draw, markdown)
