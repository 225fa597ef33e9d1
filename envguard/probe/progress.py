"""Progress reporting as an observer, so core code never prints (pip-audit's AuditState)."""

from __future__ import annotations

from typing import Protocol


class Progress(Protocol):
    """Receives progress of long steps; the CLI renders it, tests ignore it."""

    def start(self, description: str, total: int) -> None: ...

    def advance(self, amount: int) -> None: ...

    def finish(self) -> None: ...


class NullProgress:
    """Discards progress."""

    def start(self, description: str, total: int) -> None:
        pass

    def advance(self, amount: int) -> None:
        pass

    def finish(self) -> None:
        pass
