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
    out.append(where_given())
    return "\n".join(out)


def where_given() -> str:
    """A table of a party's options (client/options.py) and where each may be given."""
    from xclp.client.options import OPTIONS, Source

    places = ((Source.FLAG, "`xclp-client run`"), (Source.RUN_TOML, "party.toml (`--config`)"),
              (Source.API, "`xclp.client.run`"), (Source.AGENT, "agent.toml"), (Source.POLICY, "agent.toml [policy]"))
    rows = ["## Where each option of a party may be given\n",
            "One table of options (client/options.py) makes `xclp-client run`'s flags and is what party.toml, "
            "`xclp.client.run`'s keywords and agent.toml are read and checked by: the same name (a flag with "
            "dashes, a key or keyword with underscores), the same meaning and default. An error names the "
            "option the way it was given (`--min-parties`, `min_parties in party.toml`, `[policy] min_parties "
            "in agent.toml`, the keyword `min_parties`).\n",
            "| option | kind | default | " + " | ".join(name for _, name in places) + " |",
            "|---|---|---|" + "---|" * len(places)]
    for option in OPTIONS.values():
        if option.hidden:
            continue
        marks = " | ".join("yes" if source in option.sources else "" for source, _ in places)
        old = f" (also `{', '.join(option.old_names)}`)" if option.old_names else ""
        rows.append(f"| `{option.name}`{old} | {option.kind.value} | {_toml(option.default)} | {marks} |")
    rows.append("\nThe agent's own (`xclp-client run --help` gives the meaning of the rest):\n")
    rows += [f"- `{o.name}`: {o.help}" for o in OPTIONS.values() if not o.sources & Source.FLAG]
    return "\n".join(rows) + "\n"


def _toml(value: object) -> str:
    """A default as a TOML file would write it."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, float):
        return f"`{value:g}`"
    return f"`{value!r}`".replace("'", '"')


if __name__ == "__main__":
    from pathlib import Path

    (Path(__file__).resolve().parent / "cli.md").write_text(reference())
