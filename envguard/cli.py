"""The command line: parse, build options, call one core function, map errors to exit codes.

This is the only module that prints or exits. Exit codes are :class:`ExitCode`
and are documented in docs/CLI.md.
"""

from __future__ import annotations

import argparse
import os
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from envguard import __version__
from envguard.errors import EnvguardError, OutputError
from envguard.exitcodes import ExitCode
from envguard.render.formats import OutputFormat

if TYPE_CHECKING:
    from rich.console import Console

    from envguard.model import Snapshot
    from envguard.probe import SnapshotOptions

SNAPSHOT_DIR = Path(".envguard") / "snapshots"


class _Parser(argparse.ArgumentParser):
    """argparse, but usage errors are one line and exit with ExitCode.USAGE."""

    def error(self, message: str) -> NoReturn:
        from envguard.render.sanitize import clean

        sys.stderr.write(f"{self.prog}: error: {clean(message)} (see {self.prog} --help)\n")
        raise SystemExit(ExitCode.USAGE)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="envguard",
        description="Record the environment a training run worked in; explain what changed.",
    )
    parser.add_argument("--version", action="version", version=f"envguard {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True

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

    dif = sub.add_parser(
        "diff", help="explain what changed between two snapshots",
        description="Compare two snapshots and explain the likely causes of a regression, "
        "most likely first, with evidence and a remedy.",
        epilog="exit status: 0 equivalent, 1 different, 2 bad input or usage "
        "(see docs/CLI.md)")
    dif.add_argument("old", metavar="GOOD.json", help="the snapshot of the state that worked")
    dif.add_argument("new", metavar="NOW.json", help="the snapshot of the state that fails")
    dif.add_argument("--format", choices=[f.value for f in OutputFormat], default="text",
                     help="text (default, for a terminal), json (stable schema) or markdown")
    dif.add_argument("--symptom", metavar="TEXT",
                     help="a pasted error line; findings it points at come first")
    dif.add_argument("--all", action="store_true", help="list every change, also immaterial")
    dif.set_defaults(handler=cmd_diff)

    from envguard import cli_cache, cli_fleet, cli_gate, cli_restore

    cli_gate.add_parsers(sub)
    cli_restore.add_parsers(sub)
    cli_cache.add_parsers(sub)
    cli_fleet.add_parsers(sub)
    return parser


def _stderr_console() -> Console:
    from rich.console import Console

    return Console(stderr=True, highlight=False, soft_wrap=False)


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


def add_probe_options(parser: argparse.ArgumentParser) -> None:
    """The flags that say what a snapshot probes (``snapshot`` and ``fleet snapshot``)."""
    parser.add_argument("--python", metavar="PY",
                        help="snapshot another interpreter or venv folder (stdlib-only probe)")
    parser.add_argument("--file", dest="files", action="append", default=[], metavar="GLOB",
                        help="record size, md5 and sha256 of matching files (repeatable)")
    parser.add_argument("--verify", choices=("size", "hash", "none"), default="size",
                        help="check installed files against RECORD by size (default) or hash")
    parser.add_argument("--deep", action="store_true",
                        help="also import torch in a crash-isolated subprocess")
    parser.add_argument("--no-cache-marker", action="store_true",
                        help="do not record the current build in the compile caches")
    parser.add_argument("--no-project-config", action="store_true",
                        help="ignore [tool.envguard] in the nearest pyproject.toml")


def probe_options(args: argparse.Namespace) -> SnapshotOptions:
    """SnapshotOptions from the flags of :func:`add_probe_options`."""
    from envguard.probe import SnapshotOptions

    return SnapshotOptions(
        python=args.python,
        verify=args.verify,
        deep=args.deep,
        file_patterns=tuple(args.files),
        write_cache_marker=not args.no_cache_marker,
        use_project_config=not args.no_project_config,
    )


def cmd_snapshot(args: argparse.Namespace) -> int:
    from envguard.atomic import write_text_atomic
    from envguard.probe import collect

    options = probe_options(args)
    show_summary = not args.quiet
    console = _stderr_console() if show_summary or sys.stderr.isatty() else None
    progress = _RichProgress(console) if console is not None and console.is_terminal else None
    snapshot = collect(options, progress)
    text = snapshot.to_json()
    destination: str | None = None
    if args.json:
        _write_stdout(text)
    else:
        path = Path(args.output) if args.output else _default_snapshot_path()
        write_text_atomic(path, text)
        destination = str(path)
        if not args.output:
            print(destination)
    if show_summary and console is not None:
        _print_summary(console, snapshot, destination)
    return ExitCode.OK


def cmd_diff(args: argparse.Namespace) -> int:
    from envguard.diff import diff
    from envguard.explain import explain
    from envguard.report import DiffReport
    from envguard.store import read_snapshot

    old, new = read_snapshot(args.old), read_snapshot(args.new)
    changes = diff(old, new)
    report = DiffReport(old_name=args.old, new_name=args.new, diff=changes,
                        findings=tuple(explain(old, new, changes, args.symptom)),
                        symptom=args.symptom)
    fmt = OutputFormat(args.format)
    if fmt is OutputFormat.TEXT:
        from rich.console import Console

        from envguard.render import diff_text

        Console(highlight=False).print(diff_text.render(report, show_all=args.all))
    elif fmt is OutputFormat.JSON:
        from envguard.render import diff_json

        _write_stdout(diff_json.render(report))
    elif fmt is OutputFormat.MARKDOWN:
        from envguard.render import diff_markdown

        _write_stdout(diff_markdown.render(report, show_all=args.all))
    else:  # pragma: no cover - every member is handled above (mypy checks)
        _unreachable(fmt)
    return ExitCode.OK if report.equivalent else ExitCode.DRIFT


def _unreachable(value: NoReturn) -> NoReturn:
    raise AssertionError(f"unhandled {value!r}")


def _write_stdout(text: str) -> None:
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:
        raise OutputError("stdout closed before the output was written") from None


def _print_summary(console: Console, snapshot: Snapshot, destination: str | None) -> None:
    from envguard.render.summary import snapshot_summary

    console.print(snapshot_summary(snapshot, destination))


def _fail(message: str, code: ExitCode) -> int:
    from envguard.render.sanitize import clean

    sys.stderr.write(f"envguard: error: {clean(message, 1000)}\n")
    return int(code)


def main(argv: list[str] | None = None) -> int:
    """Run envguard; returns the exit status (``__main__`` passes it to sys.exit)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        return int(args.handler(args))
    except SystemExit as exc:  # argparse --help/--version/usage errors
        return int(exc.code) if isinstance(exc.code, int) else int(ExitCode.USAGE)
    except EnvguardError as exc:
        return _fail(str(exc), exc.exit_code)
    except KeyboardInterrupt:
        sys.stderr.write("envguard: interrupted\n")
        return int(ExitCode.INTERRUPTED)
    except Exception as exc:
        if os.environ.get("ENVGUARD_DEBUG"):
            raise
        return _fail(f"internal error: {type(exc).__name__}: {exc} (set ENVGUARD_DEBUG=1 for "
                     "the traceback, and please report it)", ExitCode.INTERNAL_ERROR)
