"""``envguard install``: predict an installer command's change exactly to the build, refuse a
critical one, run it, and check the result against the prediction.

Part of the CLI layer (it prints and picks the exit status): the command is
:mod:`envguard.install.command`'s, the prediction :mod:`envguard.install.predict`'s, the
real run and its revision :mod:`envguard.install.apply`'s.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from envguard.cli.options import add_format_option, select_environment
from envguard.cli.output import StderrProgress, note, show
from envguard.cli.program import sigterm_interrupts
from envguard.exitcodes import ExitCode


def add_parsers(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser(
        "install", help="predict what an install would change, refuse a breaking one, run it",
        usage="envguard install [--yes] [--dry-run] [--python PY] [--format F] -- "
        "uv pip install|uninstall|sync ... | pip install|uninstall ...",
        description="Run the installer command on a scratch copy of the environment first "
        "(links to its metadata, kept beside it for the next install), snapshot the copy, "
        "and explain the difference with the rules of envguard diff: a same-version "
        "rebuild of torch is seen before it is installed. A critical finding, or a lock "
        "of ./lockfiles the change would break, refuses the command; otherwise the change "
        "is made (uv: the copy's new files are moved into place, so uv runs once; pip runs "
        "again in the environment), the result is checked against the prediction and "
        "recorded as a revision (envguard undo).",
        epilog="exit status: 0 installed as predicted (or --dry-run: nothing critical), "
        "1 installed but not as predicted, 2 bad input or usage, 3 refused, 4 the installer "
        "failed, 130 interrupted (envguard help install)")
    p.add_argument("--yes", action="store_true",
                   help="install even when the prediction is refused")
    p.add_argument("--dry-run", action="store_true",
                   help="only predict: change nothing (exit 3 when it would be refused)")
    p.add_argument("--python", metavar="PY",
                   help="the environment to change: an interpreter or venv folder (default: "
                   "the discovery rule, as envguard snapshot)")
    add_format_option(p, help="text (default), json (envguard.install/1) or markdown")
    p.add_argument("--all", action="store_true", help="also list informational findings")
    p.add_argument("argv", nargs=argparse.REMAINDER, metavar="COMMAND",
                   help="the installer command, after --, passed on as a list")
    p.set_defaults(handler=cmd_install)


def cmd_install(args: argparse.Namespace) -> int:
    import dataclasses

    from envguard.install.command import parse_command
    from envguard.install.report import InstallReport
    from envguard.restore.build import find_uv

    argv = list(args.argv)
    if argv and argv[0] == "--":
        argv = argv[1:]
    command = parse_command(argv, uv=find_uv() if argv[:1] == ["uv"] else None)
    selection = select_environment(args.python, probe=True, verify="none")
    if command.action == "sync":
        from envguard.probe.interpreter import is_current_interpreter

        if is_current_interpreter(selection.executable):
            from envguard.errors import InputError

            raise InputError("uv pip sync would sync the environment envguard itself runs in; "
                             "pass --python PY for the environment to change")
    import os

    from envguard.install.predict import predict, same_environment

    same_environment(command, Path(os.path.realpath(selection.prefix)))  # before any work
    cwd = Path.cwd()
    with sigterm_interrupts(), StderrProgress(note_after=0) as progress:
        progress.step(f"predicting on a copy of the environment: {' '.join(command.argv[:3])}")
        plan = predict(command, python=selection.executable, cwd=cwd, stage=not args.dry_run,
                       meanwhile=_import_the_rest)
    report = InstallReport(plan=plan)
    if args.dry_run or (plan.refused and not args.yes):
        from envguard.install.scratch import wait_for_removals
        from envguard.install.transplant import discard

        discard(plan.staged)
        show(report, args.format, show_all=args.all)
        wait_for_removals()
        return ExitCode.REFUSED if plan.refused else ExitCode.OK
    if args.format == "text":
        show(report, args.format, show_all=args.all)
    from envguard.install.apply import apply_install

    with sigterm_interrupts():  # the keep step, before the installer, stops like Ctrl-C
        applied = apply_install(plan, command, cwd=cwd,
                                echo=lambda line: note(f"{command.tool}: {line}"))
    final = dataclasses.replace(report, applied=applied, forced=plan.refused)
    show(final, args.format, show_all=args.all)  # text: only the outcome, after the plan
    if applied.interrupted:
        note("interrupted: the installer was let finish, so the environment is not left "
             "half-changed; envguard undo returns to the state before")
        return ExitCode.INTERRUPTED
    if applied.exit_code != 0:
        return ExitCode.ENVIRONMENT_ERROR
    return ExitCode.DRIFT if applied.differences else ExitCode.OK


def _import_the_rest() -> None:
    """What the command needs after the prediction, imported while the installer runs on the
    copy (:func:`envguard.install.predict.predict`'s ``meanwhile``)."""
    import envguard.install.apply
    import envguard.install.report
    import envguard.render.install  # noqa: F401 - imported for its cost, now
