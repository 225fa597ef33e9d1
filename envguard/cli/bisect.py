"""``envguard bisect``: the command-line side of :mod:`envguard.bisect`."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from envguard.cli.options import REF_HELP, add_format_option, add_index_options, index_options
from envguard.cli.output import StderrProgress, note, show
from envguard.cli.program import sigterm_interrupts
from envguard.errors import InputError
from envguard.exitcodes import ExitCode

USAGE = ("envguard bisect GOOD BAD [--python PY] [--find-links PATH ...] [--index-url URL] "
         "[--timeout S] [--runs N] [-j N] [--keep] [--format F] -- CMD [ARGS...]")


def _positive(kind: type[int] | type[float]) -> Any:
    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if value <= 0 or value != value or value == float("inf"):
            raise argparse.ArgumentTypeError(f"must be a positive number: {text!r}")
        return value

    return parse


def add_parsers(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser(
        "bisect", help="find which change between GOOD and BAD breaks a command",
        usage=USAGE,
        description="Build the environments between GOOD's and BAD's package sets with uv "
        "(in a work folder; yours are left alone) and run CMD in each, until a minimal set "
        "of changes that makes CMD fail is left (delta debugging, so changes that fail only "
        "together are found too). GOOD and BAD are each " + REF_HELP + ". CMD exit "
        "status: 0 passes, 125 cannot test (skipped), anything "
        "else or a timeout fails.",
        epilog="exit status: 0 culprit found, 1 inconclusive (skipped trials or a flaky "
        "command), 2 bad input, 3 refused (CMD fails in GOOD's set or passes in BAD's), "
        "4 uv missing or failed (envguard help bisect)")
    p.add_argument("good", metavar="GOOD", help="the snapshot of the state that worked")
    p.add_argument("bad", metavar="BAD", help="the snapshot of the state that fails")
    p.add_argument("--python", metavar="PY",
                   help="the interpreter of every trial venv (default: BAD's, else GOOD's)")
    add_index_options(p, find_links_help="a folder of wheels, passed to uv (repeatable); "
                      "also searched for exact builds")
    p.add_argument("--timeout", type=_positive(float), metavar="S",
                   help="seconds per run of CMD; a run that takes longer fails (default: none)")
    p.add_argument("--runs", type=_positive(int), default=1, metavar="N",
                   help="run CMD N times per trial; a trial fails if any run fails")
    p.add_argument("-j", "--jobs", type=_positive(int), default=1, metavar="N",
                   help="trials at once (default 1)")
    p.add_argument("--keep", action="store_true", help="keep the trial venvs")
    p.add_argument("--dry-run", action="store_true",
                   help="list the changes and find the exact builds; build and run nothing "
                   "(no command needed)")
    p.add_argument("--workdir", metavar="DIR",
                   help="where trial venvs are made (default: envguard's cache folder; put "
                   "it on the filesystem of uv's cache so that uv can hard-link)")
    add_format_option(p, help="text (default), json (envguard.bisect/1) or markdown")
    p.add_argument("argv", nargs=argparse.REMAINDER, metavar="CMD",
                   help="the command and its arguments, after --")
    p.set_defaults(handler=cmd_bisect, bisect_parser=p)


def _split_command(args: argparse.Namespace) -> tuple[argparse.Namespace, list[str]]:
    """The options and the command. After GOOD and BAD, argparse's REMAINDER also takes the
    options that follow them (``GOOD BAD --runs 3 -- CMD``): those, up to ``--``, are parsed
    again onto the same namespace."""
    argv = list(args.argv)
    if "--" in argv:
        cut = argv.index("--")
        options, command = argv[:cut], argv[cut + 1:]
        if options:
            args = args.bisect_parser.parse_args([*options, args.good, args.bad],
                                                 namespace=args)
        return args, command
    if argv and argv[0].startswith("-"):  # options only (--dry-run), or a command without --
        args = args.bisect_parser.parse_args([*argv, args.good, args.bad], namespace=args)
        return args, []
    return args, argv


def cmd_bisect(args: argparse.Namespace) -> int:
    from envguard.bisection.engine import BisectOptions, bisect
    from envguard.bisection.report import FOUND, PLANNED, REFUSED
    from envguard.cli.options import load_pair

    args, argv = _split_command(args)
    if not argv and not args.dry_run:
        raise InputError(f"no command: {USAGE}")
    good, bad = load_pair(args.good, args.bad)
    options = BisectOptions(
        command=tuple(argv), python=args.python, index=index_options(args),
        timeout=args.timeout, runs=args.runs, jobs=args.jobs,
        keep=args.keep, dry_run=args.dry_run,
        workdir=Path(args.workdir).absolute() if args.workdir else None,
        cwd=os.getcwd())
    with sigterm_interrupts(), StderrProgress(note_after=0) as progress:
        report = bisect(good.snapshot, bad.snapshot, options, good_name=good.label,
                        bad_name=bad.label, step=progress.step)
    show(report, args.format)
    if report.verdict == REFUSED:
        note(report.reason)
        return ExitCode.REFUSED
    return ExitCode.OK if report.verdict in (FOUND, PLANNED) else ExitCode.DRIFT
