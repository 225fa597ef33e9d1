"""Progress reporting as an observer, so core code never prints (pip-audit's AuditState).

A long operation says what it is doing: :meth:`Progress.step` for work of unknown length
(importing torch, waiting for nvidia-smi or for other ranks, writing an archive),
:meth:`Progress.start` and :meth:`Progress.advance` for work measured in bytes (hashing),
:meth:`Progress.finish` when it is over. One step at a time: a new step ends the last.
The command line renders it (:class:`envguard.cli.output.StderrProgress`); tests and
library callers pass nothing and get :class:`NullProgress`.
"""

from __future__ import annotations

from typing import Protocol


class Progress(Protocol):
    """Receives progress of long steps; the CLI renders it, tests ignore it."""

    def step(self, description: str) -> None:
        """Work of unknown length begins (a spinner, or one line when not on a terminal)."""

    def start(self, description: str, total: int) -> None:
        """Work of ``total`` bytes begins; :meth:`advance` reports what is done."""

    def advance(self, amount: int) -> None: ...

    def finish(self) -> None:
        """The current step is over."""


class NullProgress:
    """Discards progress."""

    def step(self, description: str) -> None:
        pass

    def start(self, description: str, total: int) -> None:
        pass

    def advance(self, amount: int) -> None:
        pass

    def finish(self) -> None:
        pass
