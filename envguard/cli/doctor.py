"""``envguard doctor``: one environment's problems, no baseline needed; ``--fix`` applies
the safe ones (:mod:`envguard.doctor.fix`)."""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path
from typing import Any

from envguard.cli.options import (
    add_examine_options,
    add_index_options,
    examined_snapshot,
    index_options,
)
from envguard.cli.output import note, show, stderr_console
from envguard.errors import InputError, RestoreError
from envguard.exitcodes import ExitCode


def add_parsers(sub: argparse._SubParsersAction[Any]) -> None:
    doc = sub.add_parser(
        "doctor", help="what is wrong with this environment (no earlier snapshot needed)",
        description="Check one environment alone: unmet requirements, extensions built for "
                    "another torch, mixed CUDA wheel families, a driver too old for torch's "
                    "CUDA, CUDA libraries shadowed by LD_LIBRARY_PATH, duplicate "
                    "distributions, a CPU torch on a GPU host, inference stacks, edited "
                    "site-packages files, cold or stale compile caches. Exit 0 healthy, 1 "
                    "findings at warning or above, 2 bad input.")
    add_examine_options(doc)
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
    add_index_options(doc, find_links_help="with --fix: a folder or page of wheels, "
                      "passed to uv (repeatable)")
    doc.set_defaults(handler=cmd_doctor)


def cmd_doctor(args: argparse.Namespace) -> int:
    from envguard.doctor import diagnose
    from envguard.doctor.facts import gather

    if args.dry_run and not args.fix:
        raise InputError("--dry-run goes with --fix")
    snapshot, where = examined_snapshot(args, args.verify)
    report = diagnose(gather(snapshot, cwd=Path.cwd()), environment=where,
                      symptom=args.symptom)
    show(report, args.format)
    if args.fix:
        return _fix(report, dry_run=args.dry_run, quiet=args.quiet,
                    index=index_options(args).uv_args())
    return ExitCode.OK if report.healthy else ExitCode.DRIFT


def _fix(report: Any, *, dry_run: bool, quiet: bool, index: list[str]) -> int:
    from envguard.doctor.fix import apply, plan
    from envguard.explain.remedies import shell_line
    from envguard.restore.build import find_uv

    try:
        uv = find_uv()
    except RestoreError:
        uv = "uv"  # the plan still shows; running it reports the missing uv
    steps = plan(report, report.snapshot.interpreter.executable, uv=uv, index=index)
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
