"""``envguard doctor`` (one environment's problems, no baseline needed) and ``envguard
history`` (what happened to it, read from the disk)."""

from __future__ import annotations

import argparse
import re
import shlex
import time
from pathlib import Path
from typing import Any

from envguard.cli._common import (
    StderrProgress,
    add_format_option,
    note,
    select_environment,
    show,
    stderr_console,
)
from envguard.errors import InputError, RestoreError
from envguard.exitcodes import ExitCode

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|min|h|d|w)?\s*$")
_UNIT_S = {"s": 1, "m": 60, "min": 60, "h": 3600, "d": 86400, "w": 604800, None: 86400}


def add_parsers(sub: argparse._SubParsersAction[Any]) -> None:
    doc = sub.add_parser(
        "doctor", help="what is wrong with this environment (no earlier snapshot needed)",
        description="Check one environment alone: unmet requirements, extensions built for "
                    "another torch, mixed CUDA wheel families, a driver too old for torch's "
                    "CUDA, CUDA libraries shadowed by LD_LIBRARY_PATH, duplicate "
                    "distributions, a CPU torch on a GPU host, inference stacks, edited "
                    "site-packages files, cold or stale compile caches. Exit 0 healthy, 1 "
                    "findings at warning or above, 2 bad input.")
    _common(doc)
    doc.add_argument("--symptom", metavar="TEXT",
                     help="a pasted error line; findings it points at come first")
    doc.add_argument("--verify", choices=("size", "hash"), default="size",
                     help="check installed files against RECORD by size (default) or hash "
                          "(confirms an edit, clears an exact revert)")
    doc.add_argument("--fix", action="store_true",
                     help="apply the safe, reversible fixes after showing the plan "
                          "(reinstall a package whose files were edited, ...)")
    doc.add_argument("--dry-run", action="store_true",
                     help="with --fix: show the plan only")
    doc.set_defaults(handler=cmd_doctor)
    hist = sub.add_parser(
        "history", help="what happened to this environment, read from the disk",
        description="A timeline without any earlier snapshot: packages installed or "
                    "reinstalled (dist-info times), files modified after install, compile "
                    "caches created or written, conda's history, envguard's recorded runs; "
                    "events close in time grouped into one episode.")
    _common(hist)
    hist.add_argument("--since", metavar="DURATION", type=_duration,
                      help="only events newer than this: 90m, 6h, 3d, 2w (a bare number is "
                           "days)")
    hist.set_defaults(handler=cmd_history)


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--python", metavar="PY",
                        help="the environment to examine (default: ENVGUARD_PYTHON, "
                             "VIRTUAL_ENV, CONDA_PREFIX, .venv, this one)")
    add_format_option(parser, help="text (default), json or markdown")
    parser.add_argument("-q", "--quiet", action="store_true",
                        help="no environment line and no progress notes on stderr")


def _duration(text: str) -> float:
    found = _DURATION.match(text)
    if not found:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration (90m, 6h, 3d, 2w)")
    return float(found.group(1)) * _UNIT_S[found.group(2)]


def _snapshot(args: argparse.Namespace, verify: str) -> tuple[Any, str]:
    from envguard.doctor.facts import snapshot_options
    from envguard.probe import collect

    selection = select_environment(args.python, quiet=args.quiet)
    options = snapshot_options(selection, verify=verify)
    with StderrProgress(quiet=args.quiet) as progress:
        return collect(options, progress), selection.describe()


def cmd_doctor(args: argparse.Namespace) -> int:
    from envguard.doctor import diagnose
    from envguard.doctor.facts import gather

    if args.dry_run and not args.fix:
        raise InputError("--dry-run goes with --fix")
    snapshot, where = _snapshot(args, args.verify)
    report = diagnose(gather(snapshot, cwd=Path.cwd()), environment=where,
                      symptom=args.symptom)
    show(report, args.format)
    if args.fix:
        return _fix(report, dry_run=args.dry_run, quiet=args.quiet)
    return ExitCode.OK if report.healthy else ExitCode.DRIFT


def _fix(report: Any, *, dry_run: bool, quiet: bool) -> int:
    from envguard.doctor.fix import apply, plan
    from envguard.explain.remedies import shell_line
    from envguard.restore.build import find_uv

    try:
        uv = find_uv()
    except RestoreError:
        uv = "uv"  # the plan still shows; running it reports the missing uv
    steps = plan(report, report.snapshot.interpreter.executable, uv=uv)
    console = stderr_console()
    if not steps:
        note("--fix: nothing here has a safe automatic fix; the remedies above say what to do")
        return ExitCode.OK if report.healthy else ExitCode.DRIFT
    console.print(f"fix plan ({len(steps)} step(s)):", markup=False, soft_wrap=True)
    for i, step in enumerate(steps, 1):
        console.print(f"  {i}. {step.action}", markup=False, highlight=False, soft_wrap=True)
        command = shell_line(step.argv) if step.argv else f"rm {shlex.quote(str(step.path))}"
        console.print(f"     {command}", markup=False, highlight=False, soft_wrap=True)
        console.print(f"     undo: {step.undo}", markup=False, highlight=False, soft_wrap=True)
    if dry_run:
        note("--dry-run: nothing changed")
        return ExitCode.OK if report.healthy else ExitCode.DRIFT
    results = apply(steps, lambda line: None if quiet else note(f"fixing: {line}"))
    failed = [r for r in results if not r.ok]
    for r in failed:
        note(f"fix failed: {r.step.action}: {r.message}")
    note(f"--fix: {len(results) - len(failed)} of {len(results)} step(s) done; run envguard "
         "doctor again to check")
    return ExitCode.DRIFT if failed else ExitCode.OK


def cmd_history(args: argparse.Namespace) -> int:
    from envguard.history.collect import read_timeline

    snapshot, _ = _snapshot(args, "size")
    timeline = read_timeline(snapshot, cwd=Path.cwd())
    if args.since is not None:
        timeline = timeline.since(time.time() - args.since)
    show(timeline, args.format)
    return ExitCode.OK
