"""The command-line reference (docs/cli.md) is what the programs print: regenerated from the
parsers it must equal the file, and the installed console scripts' own --help output (a real
process, COLUMNS=100) must be in it word for word."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "cli.md"
_spec = importlib.util.spec_from_file_location("cli_reference", ROOT / "docs" / "cli_reference.py")
assert _spec is not None and _spec.loader is not None
cli_reference = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(cli_reference)
WIDTH, commands, parsers, reference = (cli_reference.WIDTH, cli_reference.commands, cli_reference.parsers,
                                       cli_reference.reference)


def test_the_reference_is_current():
    assert DOC.read_text() == reference(), "run scripts/gen-cli-reference and commit docs/cli.md"


def test_every_subcommand_has_a_section():
    sections = re.findall(r"^## `(.+)`$", DOC.read_text(), re.M)
    assert sections == [prog for parser in parsers() for prog, _ in commands(parser)]
    assert "xclp-client run" in sections and "xclp-server job show" in sections


def script(name: str) -> str:
    found = shutil.which(name) or str(Path(sys.executable).parent / name)
    if not Path(found).exists():
        pytest.skip(f"{name} is not installed as a console script")
    return found


@pytest.mark.parametrize("argv", [["xclp-client", "run"], ["xclp-client", "agent"], ["xclp-server", "serve"],
                                  ["xclp-server", "job", "submit"]])
def test_the_installed_programs_print_what_the_reference_shows(argv):
    out = subprocess.run([script(argv[0]), *argv[1:], "--help"], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "COLUMNS": str(WIDTH)}, check=True).stdout
    block = f"## `{' '.join(argv)}`\n\n```text\n{out.rstrip()}\n```\n"
    assert block in DOC.read_text()
