"""The command-line reference (docs/cli.md), generated from the argparse parsers themselves.

Every command and subcommand of `xclp-client` and `xclp-server`, each with its `--help` text as
argparse prints it at a fixed width, so the reference and the programs cannot drift:
`python docs/cli_reference.py` (scripts/gen-cli-reference) rewrites the file and
tests/test_cli_reference.py fails when they differ. It lives beside the docs, not in the package:
it imports both the client and the server, which no installed module but the simulation may.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterator
from contextlib import contextmanager

WIDTH = 100  # the terminal width the reference is formatted for (COLUMNS)


@contextmanager
def _columns(width: int) -> Iterator[None]:
    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = str(width)
    try:
        yield
    finally:
        if old is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = old


def commands(parser: argparse.ArgumentParser) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """(prog, parser) for the parser and every subcommand below it, depth first, in declared order."""
    yield parser.prog, parser
    for action in parser._actions:  # argparse keeps subcommands only here
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from commands(sub)


def parsers() -> list[argparse.ArgumentParser]:
    from xclp.client.cli import _parser as client_parser
    from xclp.server.cli import _parser as server_parser

    return [client_parser(), server_parser()]


def help_text(parser: argparse.ArgumentParser, width: int = WIDTH) -> str:
    """What `<prog> --help` prints with COLUMNS=width."""
    with _columns(width):
        return parser.format_help()


def reference(width: int = WIDTH) -> str:
    """docs/cli.md: a section per command with its --help text."""
    out = ["# Command-line reference\n",
           "Generated from the programs' own argument parsers by `scripts/gen-cli-reference` "
           f"(each block is what `--help` prints in a terminal {width} columns wide); "
           "`tests/test_cli_reference.py` fails when it and the programs differ.\n"]
    for parser in parsers():
        for prog, sub in commands(parser):
            out.append(f"## `{prog}`\n\n```text\n{help_text(sub, width).rstrip()}\n```\n")
    return "\n".join(out)


if __name__ == "__main__":
    from pathlib import Path

    (Path(__file__).resolve().parent / "cli.md").write_text(reference())
