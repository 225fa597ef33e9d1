"""What every command of the command line shares: the parser class, stdout, stderr, the
probe flags, and the one handler that turns an :class:`EnvguardError` into an exit status.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, NoReturn, TextIO

from envguard.errors import EnvguardError, OutputError
from envguard.exitcodes import ExitCode

if TYPE_CHECKING:
    from rich.console import Console

    from envguard.probe import SnapshotOptions
    from envguard.render import Report


class Parser(argparse.ArgumentParser):
    """argparse, but usage errors are one line and exit with ExitCode.USAGE."""

    def error(self, message: str) -> NoReturn:
        from envguard.render.sanitize import clean

        sys.stderr.write(f"{self.prog}: error: {clean(message)} (see {self.prog} --help)\n")
        raise SystemExit(ExitCode.USAGE)


def write_stdout(text: str) -> None:
    """The one way output reaches stdout: a closed pipe is an OutputError (exit 5)."""
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:
        raise OutputError("stdout closed before the output was written") from None


def show(report: Report, fmt: str, *, show_all: bool = False) -> None:
    """``report`` rendered in format ``fmt`` (text fitted to stdout) on stdout."""
    from envguard.render import render

    write_stdout(render(report, fmt, show_all=show_all, screen=StreamScreen(sys.stdout)))


def note(message: str, *, limit: int = 1000) -> None:
    """One ``envguard: ...`` line on stderr, made safe to show."""
    from envguard.render.sanitize import clean

    sys.stderr.write(f"envguard: {clean(message, limit)}\n")
    sys.stderr.flush()


def stderr_console() -> Console:
    from rich.console import Console

    return Console(stderr=True, highlight=False, soft_wrap=False)


class StreamScreen:
    """The :class:`~envguard.render.Screen` of a stream, measured by rich the first time it is
    asked (so that output which needs no rich never imports it)."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    @functools.cached_property
    def _console(self) -> Console:
        from rich.console import Console

        return Console(file=self._stream, highlight=False)

    @property
    def width(self) -> int:
        return self._console.width

    @property
    def color_system(self) -> str | None:
        return self._console.color_system


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


def _fail(message: str, code: ExitCode) -> int:
    from envguard.render.sanitize import clean

    sys.stderr.write(f"envguard: error: {clean(message, 1000)}\n")
    return int(code)


def run_command(parser: argparse.ArgumentParser, argv: list[str] | None) -> int:
    """Parse ``argv`` and run its handler; every error becomes its exit status, here only."""
    try:
        args = parser.parse_args(argv)
        handler: Callable[[argparse.Namespace], int] = args.handler
        return int(handler(args))
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
