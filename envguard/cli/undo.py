"""``envguard undo``: return the environment to the revision before the last recorded change
(or to revision N), exactly to the build, proven on a scratch copy first.

Part of the CLI layer; the engine is :mod:`envguard.revisions.undo`.
"""

from __future__ import annotations

import argparse
from typing import Any

from envguard.cli.options import add_format_option, select_environment
from envguard.cli.output import StderrProgress, note, show
from envguard.cli.program import sigterm_interrupts
from envguard.exitcodes import ExitCode


def _revision(text: str) -> int:
    if not text.isascii() or not text.isdigit() or len(text) > 6:
        raise argparse.ArgumentTypeError(f"not a revision number: {text!r}")
    return int(text)


def add_parsers(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser(
        "undo", help="return the environment to a recorded revision, exactly to the build",
        description="Return the environment in place to the state before the last change "
        "envguard recorded (or to revision N of envguard revisions). Each build comes from "
        "uv's cache (by its RECORD fingerprint), the builds envguard install kept before "
        "replacing them (pip's), or the URL the snapshot recorded, never "
        "'the same version' from an index; the result is built and proven on a scratch copy "
        "before the environment is touched.",
        epilog="exit status: 0 restored exactly (or --dry-run), 1 a build cannot be found or "
        "the result is not exact (the environment is left as it was), 2 bad input, "
        "4 uv failed, 130 interrupted (envguard help install)")
    p.add_argument("--to", type=_revision, metavar="N",
                   help="the revision to return to (default: the one before the last change)")
    p.add_argument("--dry-run", action="store_true",
                   help="show the plan and where each build comes from; change nothing")
    p.add_argument("--python", metavar="PY",
                   help="the environment: an interpreter or venv folder (default: the "
                   "discovery rule, as envguard snapshot)")
    add_format_option(p, help="text (default), json (envguard.undo/1) or markdown")
    p.add_argument("--all", action="store_true", help="also list packages that stay")
    p.set_defaults(handler=cmd_undo)


def cmd_undo(args: argparse.Namespace) -> int:
    from envguard.revisions.undo import undo

    selection = select_environment(args.python)
    with sigterm_interrupts(), StderrProgress(note_after=0) as progress:
        report = undo(selection.executable, to=args.to, dry_run=args.dry_run,
                      echo=lambda line: note(f"uv: {line}"), step=progress.step)
    show(report, args.format, show_all=args.all)
    return ExitCode.OK if report.ok else ExitCode.DRIFT
