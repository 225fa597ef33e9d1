"""What every command of the command line shares: the parser class, stdout, stderr, the
probe flags, and the one handler that turns an :class:`EnvguardError` into an exit status.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, NoReturn, TextIO

from envguard.cli._encoding import encodable
from envguard.errors import EnvguardError, OutputError
from envguard.exitcodes import ExitCode

if TYPE_CHECKING:
    from rich.console import Console

    from envguard.probe import SnapshotOptions
    from envguard.probe.discovery import Selection
    from envguard.render import Report
    from envguard.restore.plan import IndexOptions


class Parser(argparse.ArgumentParser):
    """argparse, but usage errors are one line and exit with ExitCode.USAGE."""

    def error(self, message: str) -> NoReturn:
        from envguard.redact import redact_usage
        from envguard.render.sanitize import clean

        line = clean(redact_usage(message, sys.argv[1:]))  # it may quote --token=X
        sys.stderr.write(f"{self.prog}: error: {line} (see {self.prog} --help)\n")
        raise SystemExit(ExitCode.USAGE)


def write_stdout(text: str) -> None:
    """The one way output reaches stdout. A stdout that is closed (``>&-``), full
    (``> /dev/full``) or a pipe closed early is an OutputError (exit 5). On a stdout whose
    encoding lacks a character (``PYTHONIOENCODING=ascii``, a latin-1 locale), the text gets
    ASCII stand-ins (``->`` for ``→``) instead of failing."""
    from envguard.render.sanitize import escape_invisible

    stream = sys.stdout
    if stream is None:
        raise OutputError("stdout is closed: nothing could be written")
    try:
        stream.write(encodable(escape_invisible(text), getattr(stream, "encoding", None)))
        stream.flush()
    except BrokenPipeError:
        _silence_stdout()
        raise OutputError("stdout closed before the output was written") from None
    except OSError as exc:
        _silence_stdout()
        raise OutputError(f"cannot write to stdout: {exc.strerror or exc}") from None
    except ValueError:  # the stream object was closed
        raise OutputError("stdout is closed: nothing could be written") from None


def _silence_stdout() -> None:
    """After a failed write, point fd 1 at /dev/null so that the interpreter's own flush at
    exit does not fail a second time (Python would then exit 120 with a traceback)."""
    try:
        fd = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(fd, sys.stdout.fileno())
        finally:
            os.close(fd)
    except (OSError, ValueError, AttributeError):
        pass


def show(report: Report, fmt: str, *, show_all: bool = False) -> None:
    """``report`` rendered in format ``fmt`` (text fitted to stdout) on stdout."""
    from envguard.render import render

    write_stdout(render(report, fmt, show_all=show_all, screen=StreamScreen(sys.stdout)))


def note(message: str, *, limit: int = 1000) -> None:
    """One ``envguard: ...`` line on stderr, made safe to show (credentials masked)."""
    from envguard.redact import redact_text
    from envguard.render.sanitize import clean

    sys.stderr.write(f"envguard: {clean(redact_text(message), limit)}\n")
    sys.stderr.flush()


def stderr_console() -> Console:
    from rich.console import Console

    say_environment()
    return Console(stderr=True, highlight=False, soft_wrap=False, _environ=console_environ())


_MAX_COLUMNS = 10_000


def console_environ() -> dict[str, str]:
    """The environment rich reads its size from, less a ``COLUMNS`` or ``LINES`` that is not
    a positive number of at most 10,000 (rich takes ``COLUMNS=0`` for a width of 0, and then
    prints nothing): such a value counts as unset."""
    env = dict(os.environ)
    for name in ("COLUMNS", "LINES"):
        value = env.get(name)
        if value is not None and not (value.isdigit() and 0 < int(value) <= _MAX_COLUMNS):
            del env[name]
    return env


class StreamScreen:
    """The :class:`~envguard.render.Screen` of a stream, measured by rich the first time it is
    asked (so that output which needs no rich never imports it)."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    @functools.cached_property
    def _console(self) -> Console:
        from rich.console import Console

        return Console(file=self._stream, highlight=False, _environ=console_environ())

    @property
    def width(self) -> int:
        return self._console.width if self._console.width > 0 else 80

    @property
    def color_system(self) -> str | None:
        return self._console.color_system


NOTE_AFTER_S = 2.0
"""Work that ends sooner leaves no progress note (when stderr is not a terminal)."""


class StderrProgress:
    """The one renderer of :class:`~envguard.probe.progress.Progress`.

    On a terminal: a transient rich spinner (a bar for work in bytes) on stderr, gone when
    the step ends. Elsewhere: one ``envguard: <step>`` line for a step still running after
    ``note_after`` seconds (0: at once), none with ``quiet``. Nothing at all unless
    ``shown``. A context manager: the display is gone when the block is left, however it
    is left.
    """

    def __init__(self, *, quiet: bool = False, note_after: float = NOTE_AFTER_S,
                 shown: bool = True) -> None:
        stream = sys.stderr
        self._terminal = shown and stream is not None and stream.isatty()
        self._quiet = quiet or not shown
        self._note_after = note_after
        self._live: Any = None
        self._task: Any = None
        self._timer: threading.Timer | None = None

    def __enter__(self) -> StderrProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.finish()

    def step(self, description: str) -> None:
        self._begin(description, None)

    def start(self, description: str, total: int) -> None:
        from envguard.units import human_bytes

        self._begin(description, total, f"{description} ({human_bytes(total)})")

    def advance(self, amount: int) -> None:
        if self._live is not None and self._task is not None:
            self._live.advance(self._task, amount)

    def finish(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._live is not None:
            self._live.stop()
            self._live = self._task = None

    def _begin(self, description: str, total: int | None, line: str | None = None) -> None:
        self.finish()
        if self._terminal:
            self._show(description, total)
        elif not self._quiet:
            text = line or description
            if self._note_after <= 0:
                note(text)
            else:
                self._timer = threading.Timer(self._note_after, note, (text,))
                self._timer.daemon = True
                self._timer.start()

    def _show(self, description: str, total: int | None) -> None:
        from rich import progress as rp

        from envguard.render.sanitize import clean

        columns: tuple[Any, ...] = (
            (rp.SpinnerColumn(), rp.TextColumn("{task.description}", markup=False),
             rp.TimeElapsedColumn())
            if total is None else
            (rp.TextColumn("{task.description}", markup=False), rp.BarColumn(),
             rp.DownloadColumn(), rp.TransferSpeedColumn(), rp.TimeRemainingColumn()))
        self._live = rp.Progress(*columns, console=stderr_console(), transient=True)
        self._live.start()
        from envguard.redact import redact_text

        self._task = self._live.add_task(clean(redact_text(description), 300), total=total)


def add_probe_options(parser: argparse.ArgumentParser) -> None:
    """The flags that say what a snapshot probes (``snapshot`` and ``fleet snapshot``)."""
    parser.add_argument("--python", metavar="PY",
                        help="snapshot another interpreter or venv folder (stdlib-only probe; "
                        "default: ENVGUARD_PYTHON, VIRTUAL_ENV, CONDA_PREFIX, .venv, this one)")
    parser.add_argument("--file", dest="files", action="append", default=[], metavar="GLOB",
                        help="record size, md5 and sha256 of matching files (repeatable)")
    parser.add_argument("--verify", choices=("size", "hash", "none"), default="size",
                        help="check installed files against RECORD by size (default) or hash")
    parser.add_argument("--deep", action="store_true",
                        help="also import torch in a crash-isolated subprocess")
    # Accepted, hidden, for the scripts that pass it: it never did anything (snapshots
    # never write into compile caches; docs/CLI.md).
    parser.add_argument("--no-cache-marker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--no-project-config", action="store_true",
                        help="ignore [tool.envguard] in the nearest pyproject.toml")


def select_environment(python: str | None, *, quiet: bool = False,
                       command: str | None = None, probe: bool = False,
                       verify: str = "size") -> Selection:
    """The environment a command looks at (:func:`envguard.probe.discovery.discover`), said
    on stderr in one line unless ``quiet``: ``envguard: environment: ~/t/.venv (VIRTUAL_ENV)``.
    With ``command`` (``envguard run``) and no ``python``: the interpreter that command runs
    under, when it is Python (``python`` on PATH, a console script's shebang). ``probe``:
    the command will snapshot it (under ``--verify verify``), so what that needs first
    starts now, while the command imports the rest (:func:`envguard.probe.prefetch`)."""
    from pathlib import Path

    from envguard.probe.discovery import Selection, discover, prefix_of

    selection: Selection | None = None
    if command is not None and not python:
        from envguard.gate.shebang import command_interpreter

        found = command_interpreter(command, os.environ)
        if found is not None:
            selection = Selection(executable=found[0], prefix=prefix_of(found[0]),
                                  selected_by=found[1])
    if selection is None:
        selection = discover(python, env=os.environ, cwd=Path.cwd())
    _ENVIRONMENT_LINE[:] = [] if quiet else [f"environment: {selection.describe()}"]
    if probe:
        from envguard.probe import prefetch

        prefetch(selection.python, selection.prefix, verify)
    return selection


_ENVIRONMENT_LINE: list[str] = []
"""The environment line not yet said: it comes with the command's report (before a summary
on stderr, before ``run``'s child, else when the command ends with 0 or 1), and is dropped
on an error or a refusal, which stay one line."""


def say_environment() -> None:
    """Say the pending ``envguard: environment: ...`` line, once."""
    if _ENVIRONMENT_LINE:
        line = _ENVIRONMENT_LINE.pop()
        note(line)


def probe_options(args: argparse.Namespace, selection: Selection) -> SnapshotOptions:
    """SnapshotOptions from the flags of :func:`add_probe_options`, for ``selection``."""
    from envguard.probe import SnapshotOptions

    return SnapshotOptions(
        python=selection.python,
        selected_by=selection.selected_by,
        verify=args.verify,
        deep=args.deep,
        file_patterns=tuple(args.files),
        use_project_config=not args.no_project_config,
    )


def _fail(message: str, code: ExitCode) -> int:
    from envguard.redact import redact_text
    from envguard.render.sanitize import clean

    _ENVIRONMENT_LINE.clear()
    sys.stderr.write(f"envguard: error: {clean(redact_text(message), 1000)}\n")
    return int(code)


def run_command(parser: argparse.ArgumentParser, argv: list[str] | None) -> int:
    """Parse ``argv`` and run its handler; every error becomes its exit status, here only."""
    _ENVIRONMENT_LINE.clear()
    try:
        args = parser.parse_args(argv)
        handler: Callable[[argparse.Namespace], int] = args.handler
        code = int(handler(args))
        if code in (ExitCode.OK, ExitCode.DRIFT):
            say_environment()
        return code
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


@contextlib.contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """SIGTERM (a scheduler's time limit, ``kill``) and SIGHUP (the terminal went away) act
    like Ctrl-C while uv builds or a command runs, so partial venvs are removed instead of left
    behind."""

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, interrupt) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def add_format_option(p: argparse.ArgumentParser, *, help: str) -> None:
    """``--format``: every report's text (the default), JSON and Markdown."""
    from envguard.render.formats import OutputFormat
    p.add_argument("--format", choices=[f.value for f in OutputFormat], default="text", help=help)


def add_index_options(p: argparse.ArgumentParser, *, find_links_help: str) -> None:
    """uv's index options, as ``restore`` and ``bisect`` take them."""
    p.add_argument("--index-url", metavar="URL", help="passed to uv")
    p.add_argument("--extra-index-url", action="append", default=[], metavar="URL",
                   help="passed to uv (repeatable)")
    p.add_argument("--find-links", action="append", default=[], metavar="PATH",
                   help=find_links_help)
    p.add_argument("--no-index", action="store_true", help="passed to uv: only --find-links")
    p.add_argument("--offline", action="store_true",
                   help="uv's offline mode: no network, only uv's cache and --find-links")


def index_options(args: argparse.Namespace) -> IndexOptions:
    """The options of :func:`add_index_options`, ``--find-links`` folders made absolute."""
    from envguard.restore.plan import IndexOptions, link_paths

    return IndexOptions(index_url=args.index_url, extra_index_urls=tuple(args.extra_index_url),
                        find_links=link_paths(args.find_links), no_index=args.no_index,
                        offline=args.offline)
