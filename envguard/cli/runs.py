"""``envguard runs`` and ``envguard runs prune``: the guarded runs recorded here.

Part of the CLI layer; the records are :mod:`envguard.runs.store`'s, the text is
:mod:`envguard.render.runs`'s.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from envguard.cli.options import add_format_option
from envguard.cli.output import show, write_stdout
from envguard.exitcodes import ExitCode


def _count(text: str) -> int:
    if not text.isascii() or not text.isdigit() or len(text) > 9:
        raise argparse.ArgumentTypeError(f"not a count: {text!r} (0 or more)")
    return int(text)


def add_parsers(sub: argparse._SubParsersAction[Any]) -> None:
    runs = sub.add_parser(
        "runs", help="list the guarded runs recorded here",
        description="The runs envguard run recorded under .envguard/runs, newest first: "
        "start time, command (credentials masked), exit status or signal, gate, snapshot "
        "digest. @run:N in envguard diff is the Nth row.",
        epilog="exit status: 0, 2 bad input")
    add_format_option(runs, help="text (default), json (envguard.runs/1) or markdown")
    runs.set_defaults(handler=cmd_runs)
    actions = runs.add_subparsers(dest="runs_command", metavar="ACTION")
    prune = actions.add_parser(
        "prune", help="remove old run records and the snapshots nothing refers to",
        description="Keep the N newest run records (and always the last-good one); remove "
        "the others, then every stored snapshot no kept record refers to.")
    prune.add_argument("--keep", type=_count, required=True, metavar="N",
                       help="how many of the newest runs to keep")
    prune.set_defaults(handler=cmd_prune)


def cmd_runs(args: argparse.Namespace) -> int:
    from envguard.runs.store import run_list

    show(run_list(Path.cwd()), args.format)
    return ExitCode.OK


def cmd_prune(args: argparse.Namespace) -> int:
    from envguard.runs.store import prune

    done = prune(Path.cwd(), args.keep)
    write_stdout(f"removed {len(done.runs)} run record(s) and {len(done.snapshots)} "
                 f"snapshot(s); {done.kept} run(s) kept\n")
    return ExitCode.OK
