"""What the command line writes: reports on stdout (or stderr), notes on stderr, progress.

Every byte of output goes through here: :func:`write_stdout` (the one writer of stdout),
:func:`show` (a report rendered in the format ``--format`` chose, by
:mod:`envguard.render`), :func:`note` (one ``envguard: ...`` line on stderr) and
:class:`StderrProgress`. The text of a report is the renderers'; a new output format is a
member of :class:`~envguard.render.formats.OutputFormat`, and only reaches a command
through :func:`show`.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
from typing import TYPE_CHECKING, Any, TextIO

from envguard.errors import OutputError

if TYPE_CHECKING:
    from rich.console import Console

    from envguard.render import Report

# ------------------------------------------------------------------ encodings

_STAND_INS = {"→": "->", "←": "<-", "…": "...", "–": "-", "—": "--", "·": "-", "•": "*",
              "×": "x", "≠": "!=", "≤": "<=", "≥": ">=", "▶": ">", "✓": "ok", "✗": "x",
              "“": '"', "”": '"', "‘": "'", "’": "'", "🔴": "[!]", "🟡": "[~]", "🔵": "[i]"}


@functools.cache
def _ascii_table() -> dict[int, str]:
    """ASCII stand-ins for envguard's own symbols and rich's box drawing (U+2500-U+257F)."""
    import unicodedata

    table = {ord(k): v for k, v in _STAND_INS.items()}
    for code in range(0x2500, 0x2580):
        name = unicodedata.name(chr(code), "")
        if " AND " in name or " ARC " in name:
            table[code] = "+"  # corners and junctions
        elif "HORIZONTAL" in name or name.endswith(("LEFT", "RIGHT")):
            table[code] = "-"
        else:
            table[code] = "|" if "VERTICAL" in name or name.endswith(("UP", "DOWN")) else "+"
    table.update({0x2571: "/", 0x2572: "\\", 0x2573: "X"})  # the diagonals
    return table


def encodable(text: str, encoding: str | None) -> str:
    """``text``, or where ``encoding`` cannot hold it (``PYTHONIOENCODING=ascii``, a latin-1
    locale), with ASCII stand-ins for envguard's own symbols and rich's box drawing, and
    ``?`` for anything else (a package name in another script)."""
    try:
        text.encode(encoding or "utf-8")
        return text
    except UnicodeEncodeError:
        pass
    except LookupError:  # an encoding Python does not know: leave it to the stream
        return text
    enc = encoding or "utf-8"
    return text.translate(_ascii_table()).encode(enc, errors="replace").decode(enc)


# ------------------------------------------------------------------ stdout

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


def show_on_stderr(report: Report) -> None:
    """``report`` as text on stderr, fitted to it (``envguard run``'s gate report, which
    leaves stdout to the command; the renderers are imported only when there is one)."""
    from envguard.render import render
    from envguard.render.formats import OutputFormat

    sys.stderr.write(render(report, OutputFormat.TEXT, screen=StreamScreen(sys.stderr)))


# ------------------------------------------------------------------ stderr

def note(message: str, *, limit: int = 1000) -> None:
    """One ``envguard: ...`` line on stderr, made safe to show (credentials masked)."""
    from envguard.redact import redact_text
    from envguard.render.sanitize import clean

    sys.stderr.write(f"envguard: {clean(redact_text(message), limit)}\n")
    sys.stderr.flush()


_ENVIRONMENT_LINE: list[str] = []
"""The environment line not yet said: it comes with the command's report (before a summary
on stderr, before ``run``'s child, else when the command ends with 0 or 1), and is dropped
on an error or a refusal, which stay one line."""


def hold_environment_line(line: str | None) -> None:
    """Keep ``line`` (``environment: ...``) to say with the command's report; None: none."""
    _ENVIRONMENT_LINE[:] = [] if line is None else [line]


def drop_environment_line() -> None:
    """Forget the pending environment line (a command that ends in an error)."""
    _ENVIRONMENT_LINE.clear()


def say_environment() -> None:
    """Say the pending ``envguard: environment: ...`` line, once."""
    if _ENVIRONMENT_LINE:
        line = _ENVIRONMENT_LINE.pop()
        note(line)


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


# ------------------------------------------------------------------ progress

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
