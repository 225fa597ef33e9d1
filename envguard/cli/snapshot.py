"""``envguard snapshot``: record the current environment as JSON."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from envguard.cli.options import add_probe_options, probe_options, select_environment
from envguard.cli.output import StderrProgress, stderr_console, write_stdout
from envguard.exitcodes import ExitCode
from envguard.paths import SNAPSHOT_DIR


def add_parsers(sub: argparse._SubParsersAction[Any]) -> None:
    snap = sub.add_parser("snapshot", help="record the current environment as JSON",
                          description="Record interpreter, torch build, packages, integrity, "
                          "compile caches, GPU, environment variables and your files.")
    where = snap.add_mutually_exclusive_group()
    where.add_argument("-o", "--output", metavar="PATH",
                       help="write the snapshot to PATH (atomically)")
    where.add_argument("--json", action="store_true", help="print the snapshot JSON to stdout")
    add_probe_options(snap)
    snap.add_argument("-q", "--quiet", action="store_true",
                      help="no summary and no progress notes on stderr")
    snap.set_defaults(handler=cmd_snapshot)


def _default_snapshot_path() -> Path:
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    path = SNAPSHOT_DIR / f"{stamp}.json"
    n = 1
    while path.exists():
        path = SNAPSHOT_DIR / f"{stamp}-{n}.json"
        n += 1
    return path


def cmd_snapshot(args: argparse.Namespace) -> int:
    selection = select_environment(args.python, quiet=args.quiet, probe=True,
                                   verify=args.verify)
    from envguard.atomic import write_text_atomic
    from envguard.probe import collect

    options = probe_options(args, selection)
    show_summary = not args.quiet
    with StderrProgress(quiet=args.quiet) as progress:
        snapshot = collect(options, progress)
    text = snapshot.to_json()
    destination: str | None = None
    if args.json:
        write_stdout(text)
    else:
        path = Path(args.output) if args.output else _default_snapshot_path()
        # The default place is envguard's state (never through a link); -o is the user's.
        write_text_atomic(path, text, state_root=None if args.output else Path.cwd())
        destination = str(path)
        if not args.output:
            write_stdout(f"{destination}\n")
    if show_summary:
        from envguard.render.snapshot import snapshot_summary

        stderr_console().print(snapshot_summary(snapshot, destination))
    return ExitCode.OK
