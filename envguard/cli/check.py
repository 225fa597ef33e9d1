"""``envguard check``: does this environment match a lock?

Part of the CLI layer (it prints); the gate is :func:`envguard.gate.check_command`, the
same one ``envguard run`` and ``dflash-train`` use.
"""

from __future__ import annotations

import argparse
from typing import Any

from envguard.cli.options import add_format_option, add_lock_option, lock_choice, select_environment
from envguard.cli.output import show
from envguard.errors import InputError
from envguard.exitcodes import ExitCode


def add_parsers(sub: argparse._SubParsersAction[Any]) -> None:
    chk = sub.add_parser("check", help="does this environment match a lock?",
                         epilog="exit status: 0 match, 1 mismatch, 2 error")
    chk.add_argument("name", nargs="?", help="lock name, looked up in ./lockfiles")
    add_lock_option(chk)
    chk.add_argument("--python", metavar="PY",
                     help="check another interpreter or venv folder (default: see "
                     "'Which environment' in envguard help cli)")
    add_format_option(chk, help="text (default), json (envguard.diff/1 against the closest "
                                "entry) or markdown")
    chk.add_argument("--strict", action="store_true",
                     help="every distribution must match, not only the command's closure")
    chk.add_argument("-v", "--verbose", action="store_true",
                     help="on a mismatch, every finding and change in full (text; by default "
                     "a summary of about 20 lines)")
    chk.set_defaults(handler=cmd_check)


def cmd_check(args: argparse.Namespace) -> int:
    if not args.name and not args.lock:
        raise InputError("name a lock (envguard check NAME) or pass --lock PATH")
    name, lock_path = lock_choice(args.name or "", args.lock)
    python = select_environment(args.python, probe=True).python
    from envguard.gate import check_command

    result = check_command(name, lock=lock_path, python=python, strict=args.strict,
                           relock_python=args.python)
    show(result, args.format, show_all=args.verbose)
    return ExitCode.OK if result.passed else ExitCode.DRIFT
