"""What ``dflash-eval`` and ``dflash-generate`` say on stderr while they work: one line per
phase ("loading the target", "warming up", ...), then the items done, as a rich progress
bar on a terminal and as plain lines about every 10 % when stderr is a pipe or a file.

stdout stays the command's result (the report, the JSON), so progress never mixes into
what a script parses. rich is imported only when a bar is drawn.
"""

from __future__ import annotations

import sys
import time
from types import TracebackType
from typing import Any, TextIO

from envguard.render.sanitize import escape_controls


class Progress:
    """Phase lines and one item counter at a time, on ``stream`` (default stderr)."""

    def __init__(self, prog: str, *, quiet: bool = False, stream: TextIO | None = None,
                 terminal: bool | None = None) -> None:
        self.prog = prog
        self.quiet = quiet
        self.stream = stream if stream is not None else sys.stderr
        self.terminal = (self.stream.isatty() if terminal is None else terminal)
        self.started = time.perf_counter()
        self._bar: Any = None
        self._task: Any = None
        self._label = ""
        self._total = 0
        self._tenth = 0

    def _elapsed(self) -> str:
        return f"{time.perf_counter() - self.started:.1f} s"

    def say(self, text: str) -> None:
        if self.quiet:
            return
        line = f"{self.prog}: {escape_controls(text)} [{self._elapsed()}]"  # a path: shown
        if self._bar is not None:
            self._bar.console.print(line, markup=False, highlight=False)
        else:
            print(line, file=self.stream, flush=True)

    def phase(self, text: str) -> None:
        """A new phase begins: ``loading the target…``."""
        self.say(f"{text}…")

    def start(self, label: str, total: int) -> None:
        """Count ``total`` items (prompts) from here on; :meth:`update` moves it on."""
        self.close()
        self._label, self._total, self._tenth = label, total, 0
        if self.quiet or total < 1:
            return
        if self.terminal:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )
            from rich.progress import Progress as Bar

            console = Console(file=self.stream, highlight=False)
            self._bar = Bar(TextColumn(f"{self.prog}: {label}"), BarColumn(),
                            MofNCompleteColumn(), TimeElapsedColumn(), TimeRemainingColumn(),
                            console=console, transient=True)
            self._task = self._bar.add_task(label, total=total)
            self._bar.start()

    def update(self, done: int, total: int | None = None) -> None:
        """``done`` of the items counted so far (a callback for the decoding loops)."""
        total = total or self._total
        if self.quiet or total < 1:
            return
        if self._bar is not None:
            self._bar.update(self._task, completed=done, total=total)
            return
        tenth = done * 10 // total
        if tenth > self._tenth:  # about every 10 %, and the last item
            self._tenth = tenth
            self.say(f"{self._label} {done}/{total} ({100 * done // total} %)")

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
            self._task = None

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
