"""The command line: parse, build options, call one core function, render, map errors to
exit codes.

Only this package prints or exits. One module per command (``snapshot``, ``diff``,
``doctor``: doctor/history, ``gate``: lock/check/run, ``runs``, ``restore``, ``cache``,
``fleet``, ``bisect``, ``completion``), each with its ``add_parsers``; what they share is in
:mod:`envguard.cli._common`. Exit codes are :class:`~envguard.exitcodes.ExitCode`,
documented in docs/CLI.md.
"""

from __future__ import annotations

import importlib
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import argparse

__all__ = ["build_parser", "entry", "main"]

MODULES = ("snapshot", "diff", "doctor", "gate", "restore", "bisect", "cache", "fleet", "runs",
           "completion")
"""The command modules, in the order ``--help`` lists their commands."""
COMMANDS = {"snapshot": "snapshot", "diff": "diff", "doctor": "doctor", "history": "doctor",
            "lock": "gate", "check": "gate", "run": "gate", "restore": "restore",
            "bisect": "bisect", "cache": "cache", "fleet": "fleet", "runs": "runs",
            "completion": "completion"}
"""Which module defines each command."""


def _modules_for(argv: list[str] | None) -> tuple[str, ...]:
    """The command modules the parser needs: only the one of the command named in
    ``argv`` (the gate in front of every launch should not import the others), all of
    them for ``--help``, ``-V``, no command or an unknown one (argparse lists them)."""
    words = sys.argv[1:] if argv is None else argv
    first = next((w for w in words if not w.startswith("-")), None)
    return (COMMANDS[first],) if first in COMMANDS and "completion" not in words else MODULES


def build_parser(argv: list[str] | None = None, *, every_command: bool = True
                 ) -> argparse.ArgumentParser:
    """The parser. ``every_command=False``: only the command ``argv`` names (see
    :func:`_modules_for`)."""
    from envguard.cli._common import Parser
    from envguard.version import __version__

    parser = Parser(
        prog="envguard",
        description="Record the environment a training run worked in; explain what changed.",
    )
    parser.add_argument("-V", "--version", action="version", version=f"envguard {__version__}",
                        help="print envguard's version and exit")
    parser.set_defaults(root_parser=parser)  # for envguard completion
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    sub.required = True
    for name in MODULES if every_command else _modules_for(argv):
        importlib.import_module(f"envguard.cli.{name}").add_parsers(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run envguard; returns the exit status (``__main__`` passes it to sys.exit)."""
    from envguard.cli._common import run_command

    return run_command(build_parser(argv, every_command=False), argv)


def entry() -> int:
    """The ``envguard`` console script and ``python -m envguard``: :func:`main`, after
    :func:`keep_bytecode` (this module imports nothing of envguard before it, so that
    ``envguard.cli._common`` and what it imports are compiled into the bytecode folder
    too), then :func:`end_now`."""
    keep_bytecode()
    code = main()
    say_distrusted()
    end_now(code)
    return code


def say_distrusted() -> None:
    """Under ``ENVGUARD_DEBUG``: each folder envguard did not trust with its bytecode or
    memo files, and why (:func:`envguard.paths.private_folder`); otherwise that costs only
    time, silently."""
    import os

    paths = sys.modules.get("envguard.paths")
    if paths is not None and paths.DISTRUSTED and os.environ.get("ENVGUARD_DEBUG"):
        from envguard.cli._common import note

        for line in dict.fromkeys(paths.DISTRUSTED):
            note(line)


def end_now(code: int) -> None:
    """End the process with ``code`` without the interpreter's teardown, which frees every
    object one by one (about 10 ms after a snapshot on a 2-core VM), once what an exit
    does that matters is done: the ``atexit`` handlers (forked workers and probes ended,
    coverage and the like saved) and stdout and stderr flushed. Returns instead, for an
    ordinary exit, while another non-daemon thread runs (a normal exit would wait for it),
    if a flush fails, or on an interpreter without ``atexit._run_exitfuncs``."""
    import atexit
    import os
    import threading

    run_exitfuncs = getattr(atexit, "_run_exitfuncs", None)
    main_thread = threading.main_thread()
    if run_exitfuncs is None or any(t is not main_thread and not t.daemon
                                    for t in threading.enumerate()):
        return
    run_exitfuncs()
    try:
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:  # None: the descriptor was closed at the start
                stream.flush()
    except (OSError, ValueError):
        return  # the ordinary exit reports it (a closed pipe, a full disk)
    os._exit(code)


def keep_bytecode() -> None:
    """Under ``PYTHONDONTWRITEBYTECODE``, envguard's compiled modules live in
    ``<user dir>/bytecode`` (:mod:`envguard.bytecode`): without them a guarded launch
    compiles about 80 modules from source every time."""
    from envguard.bytecode import keep_bytecode as keep
    from envguard.paths import user_dir

    keep(user_dir() / "bytecode", __file__)
