"""The command line: parse, build options, call one core function, render, map errors to
exit codes.

Only this package prints or exits. One module per command, named after it (``snapshot``,
``diff``, ``doctor``, ``history``, ``lock``, ``check``, ``run``, ``restore``, ``bisect``,
``cache``, ``fleet``, ``runs``, ``completion``), each with its ``add_parsers``. What they
share: :mod:`envguard.cli.program` (the parser, the one mapping from errors to exit
statuses, signals, the fast exit), :mod:`envguard.cli.output` (stdout, stderr, progress)
and :mod:`envguard.cli.options` (the options several commands take, and the environment
they select). Exit codes are :class:`~envguard.exitcodes.ExitCode`, documented in
docs/CLI.md.

This module is the console script's (``envguard.cli:entry``) and imports nothing of
envguard before :func:`keep_bytecode`: the modules imported after it are compiled into
the bytecode folder too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import argparse

__all__ = ["build_parser", "entry", "main"]


def build_parser(argv: list[str] | None = None, *, every_command: bool = True
                 ) -> argparse.ArgumentParser:
    """The parser (:func:`envguard.cli.program.build_parser`)."""
    from envguard.cli.program import build_parser as build

    return build(argv, every_command=every_command)


def main(argv: list[str] | None = None) -> int:
    """Run envguard; returns the exit status (``__main__`` passes it to sys.exit)."""
    from envguard.cli.program import main as run

    return run(argv)


def entry() -> int:
    """The ``envguard`` console script and ``python -m envguard``: :func:`main`, after
    :func:`keep_bytecode`, then :func:`envguard.cli.program.finish` (the fast exit)."""
    keep_bytecode()
    from envguard.cli.program import finish, main

    code = main()
    finish(code)
    return code


def keep_bytecode() -> None:
    """Under ``PYTHONDONTWRITEBYTECODE``, envguard's compiled modules live in
    ``<user dir>/bytecode`` (:mod:`envguard.bytecode`): without them a guarded launch
    compiles about 80 modules from source every time."""
    from envguard.bytecode import keep_bytecode as keep
    from envguard.paths import user_dir

    keep(user_dir() / "bytecode", __file__)
