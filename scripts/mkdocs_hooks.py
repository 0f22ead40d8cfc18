"""MkDocs hook (mkdocs.yml `hooks`): the installed package's layout for mkdocstrings.

xclp.client, xclp.server and xclp.crypto live in the top-level folders client/, server/ and
crypto/ (pyproject.toml package-dir), which griffe's static analysis cannot follow. Before the
build, this hook copies the sources into build/api-src/xclp/ in the installed layout (xclp/, with
client/, server/ and crypto/ inside it), which mkdocs.yml points griffe at. (Symbolic links would
not do: griffe follows them back to the real folders.)
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from mkdocs.plugins import event_priority

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
