"""``envguard snapshot``: record the current environment as JSON."""

from __future__ import annotations

import argparse
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from envguard.cli._common import add_probe_options, probe_options, stderr_console, write_stdout
from envguard.exitcodes import ExitCode
from envguard.paths import SNAPSHOT_DIR

if TYPE_CHECKING:
    from rich.console import Console


def add_parsers(sub: argparse._SubParsersAction[Any]) -> None:
    snap = sub.add_parser("snapshot", help="record the current environment as JSON",
                          description="Record interpreter, torch build, packages, integrity, "
                          "compile caches, GPU, environment variables and your files.")
    where = snap.add_mutually_exclusive_group()
    where.add_argument("-o", "--output", metavar="PATH",
                       help="write the snapshot to PATH (atomically)")
    where.add_argument("--json", action="store_true", help="print the snapshot JSON to stdout")
    add_probe_options(snap)
    snap.add_argument("-q", "--quiet", action="store_true", help="no summary on stderr")
    snap.set_defaults(handler=cmd_snapshot)


class _RichProgress:
    """Progress bar on stderr for long hashing runs; only on a terminal."""

    def __init__(self, console: Console) -> None:
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            Progress,
            TimeRemainingColumn,
            TransferSpeedColumn,
        )

        self._progress = Progress("{task.description}", BarColumn(), DownloadColumn(),
                                  TransferSpeedColumn(), TimeRemainingColumn(),
                                  console=console, transient=True)
        self._task: object = None

    def start(self, description: str, total: int) -> None:
        self._progress.start()
        self._task = self._progress.add_task(description, total=total)

    def advance(self, amount: int) -> None:
        if self._task is not None:
            self._progress.advance(self._task, amount)  # type: ignore[arg-type]

    def finish(self) -> None:
        self._progress.stop()


def _default_snapshot_path() -> Path:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    path = SNAPSHOT_DIR / f"{stamp}.json"
    n = 1
    while path.exists():
        path = SNAPSHOT_DIR / f"{stamp}-{n}.json"
        n += 1
    return path


def cmd_snapshot(args: argparse.Namespace) -> int:
    from envguard.atomic import write_text_atomic
    from envguard.probe import collect

    options = probe_options(args)
    show_summary = not args.quiet
    console = stderr_console() if show_summary or sys.stderr.isatty() else None
    progress = _RichProgress(console) if console is not None and console.is_terminal else None
    snapshot = collect(options, progress)
    text = snapshot.to_json()
    destination: str | None = None
    if args.json:
        write_stdout(text)
    else:
        path = Path(args.output) if args.output else _default_snapshot_path()
        write_text_atomic(path, text)
        destination = str(path)
        if not args.output:
            write_stdout(f"{destination}\n")
    if show_summary and console is not None:
        from envguard.render.summary import snapshot_summary

        console.print(snapshot_summary(snapshot, destination))
    return ExitCode.OK
