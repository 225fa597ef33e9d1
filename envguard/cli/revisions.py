"""``envguard revisions``: the changes envguard recorded for an environment (``envguard
install``, ``envguard undo``, ``envguard restore --in-place``), oldest first.

Part of the CLI layer; the records are :mod:`envguard.revisions.store`'s, the text
:mod:`envguard.render.revisions`'s.
"""

from __future__ import annotations

import argparse
from typing import Any

from envguard.cli.options import add_format_option, select_environment
from envguard.cli.output import show
from envguard.exitcodes import ExitCode


def add_parsers(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser(
        "revisions", help="list the changes envguard made to an environment",
        description="Every change made through envguard install, envguard undo and envguard "
        "restore --in-place, with its command (credentials masked), exit status, time and "
        "package changes; revision 0 is the state before the first one. envguard undo "
        "--to N returns to revision N.",
        epilog="exit status: 0, 2 bad input (envguard help install)")
    p.add_argument("--python", metavar="PY",
                   help="the environment: an interpreter or venv folder (default: the "
                   "discovery rule, as envguard snapshot)")
    add_format_option(p, help="text (default), json (envguard.revisions/1) or markdown")
    p.set_defaults(handler=cmd_revisions)


def cmd_revisions(args: argparse.Namespace) -> int:
    from envguard.revisions.store import list_revisions

    selection = select_environment(args.python)
    show(list_revisions(selection.prefix), args.format)
    return ExitCode.OK
