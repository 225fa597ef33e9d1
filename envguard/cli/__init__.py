"""The command line: parse, build options, call one core function, render, map errors to
exit codes.

Only this package prints or exits. One module per command (``snapshot``, ``diff``,
``gate``: lock/check/run, ``runs``, ``restore``, ``cache``, ``fleet``, ``completion``), each
with its ``add_parsers``; what they share is in :mod:`envguard.cli._common`. Exit codes are
:class:`~envguard.exitcodes.ExitCode`, documented in docs/CLI.md.
"""

from __future__ import annotations

import argparse

from envguard.cli import cache, completion, diff, fleet, gate, restore, runs, snapshot
from envguard.cli._common import Parser, run_command
from envguard.version import __version__

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="envguard",
        description="Record the environment a training run worked in; explain what changed.",
    )
    parser.add_argument("-V", "--version", action="version", version=f"envguard {__version__}",
                        help="print envguard's version and exit")
    parser.set_defaults(root_parser=parser)  # for envguard completion
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    sub.required = True
    for command in (snapshot, diff, gate, restore, cache, fleet, runs, completion):
        command.add_parsers(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run envguard; returns the exit status (``__main__`` passes it to sys.exit)."""
    return run_command(build_parser(), argv)
