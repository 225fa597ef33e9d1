"""Renderers: pure functions from plain data to text.

:func:`render` is the one place where an output format is chosen. Every command hands
it its report and the ``--format`` asked for, and writes the string it gets back.

Each report has one module here, and every such module has the same three renderers,
``text``, ``markdown`` and ``json``, each ``(report, show_all) -> str | rich renderable``:

==============================  ==================
report                          module
==============================  ==================
``DiffReport`` (diff)           :mod:`.diff`
``GateResult`` (check, run)     :mod:`.gate`
``FleetReport`` (fleet)         :mod:`.fleet`
``CacheStatus`` (cache)         :mod:`.cache`
``RestoreReport``,              :mod:`.restore`
``CondaRestoreReport`` (restore)
``RunList`` (runs)              :mod:`.runs`
``DoctorReport`` (doctor)       :mod:`.doctor`
``Timeline`` (history)          :mod:`.history`
``BisectReport`` (bisect)       :mod:`.bisect`
``InstallReport`` (install)     :mod:`.install`
``RevisionList`` (revisions)    :mod:`.revisions`
``UndoReport`` (undo)           :mod:`.undo`
==============================  ==================

That table is :data:`MODULES`; :func:`renderer` is the one branch over
:class:`OutputFormat` (a type checker proves it exhaustive). A report's type is
recognised by name and its module imported on first use, so that rendering one kind of
report imports nothing of the others (the gate's happy path must not even import rich).
(:mod:`.snapshot` is ``envguard snapshot``'s summary on stderr, not a ``--format``.)
"""

from __future__ import annotations

import importlib
import json
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NoReturn, Protocol, cast

from envguard.frozen import frozen
from envguard.render.formats import OutputFormat

if TYPE_CHECKING:
    from rich.console import RenderableType

    from envguard.bisection.report import BisectReport
    from envguard.cache.store import CacheStatus
    from envguard.doctor import DoctorReport
    from envguard.explain.report import DiffReport
    from envguard.fleet.analyse import FleetReport
    from envguard.gate.check import GateResult
    from envguard.history import Timeline
    from envguard.install.report import InstallReport
    from envguard.restore.report import CondaRestoreReport, RestoreReport
    from envguard.revisions.store import RevisionList
    from envguard.revisions.undo import UndoReport
    from envguard.runs.store import RunList

    Report = (DiffReport | GateResult | FleetReport | CacheStatus | RestoreReport
              | CondaRestoreReport | RunList | DoctorReport | Timeline | BisectReport
              | InstallReport | RevisionList | UndoReport)

if sys.version_info >= (3, 11):
    from typing import assert_never
else:  # pragma: no cover - Python 3.10
    def assert_never(value: NoReturn) -> NoReturn:
        raise AssertionError(f"unhandled value: {value!r}")

Renderer = Callable[[Any, bool], "str | RenderableType"]
"""``(report, show_all) -> str | rich renderable``: one format of one report."""

__all__ = ["MODULES", "PLAIN", "OutputFormat", "PlainScreen", "Renderers", "Screen", "json_text",
           "render", "renderer", "to_text"]


class Screen(Protocol):
    """Where text goes: its width in columns and rich's colour system (None: no colour)."""

    @property
    def width(self) -> int: ...

    @property
    def color_system(self) -> str | None: ...


@frozen
class PlainScreen:
    width: int = 80
    color_system: str | None = None


PLAIN = PlainScreen()
"""80 columns, no colour: what rich writes into a file or a pipe."""


def render(report: Report, fmt: OutputFormat | str, *, show_all: bool = False,
           screen: Screen = PLAIN) -> str:
    """``report`` in format ``fmt``. ``show_all``: every change, also immaterial ones (diff),
    or every package, also those that stay (restore). ``screen``: for text only."""
    fmt = OutputFormat(fmt)
    module = importlib.import_module(f"{__name__}.{MODULES[type(report).__name__]}")
    out = renderer(cast(Renderers, module), fmt)(report, show_all)
    return out if isinstance(out, str) else to_text(out, screen)


def to_text(renderable: RenderableType, screen: Screen = PLAIN) -> str:
    """A rich renderable as the text (and colour codes) rich would write to ``screen``."""
    import io

    from rich.console import Console

    buffer = io.StringIO()
    Console(file=buffer, width=screen.width, color_system=screen.color_system,  # type: ignore[arg-type]
            force_terminal=screen.color_system is not None, highlight=False,
            legacy_windows=False).print(renderable)
    return buffer.getvalue()


def json_text(document: object) -> str:
    """The JSON documents of envguard: sorted keys, two-space indent, ASCII, newline."""
    return json.dumps(document, indent=2, sort_keys=True, ensure_ascii=True) + "\n"


MODULES: dict[str, str] = {
    "DiffReport": "diff", "GateResult": "gate", "FleetReport": "fleet",
    "CacheStatus": "cache", "RestoreReport": "restore", "CondaRestoreReport": "restore",
    "RunList": "runs", "DoctorReport": "doctor", "Timeline": "history",
    "BisectReport": "bisect", "InstallReport": "install", "RevisionList": "revisions",
    "UndoReport": "undo",
}
"""Report type (its class name) -> the module of :mod:`envguard.render` that renders it."""


class Renderers(Protocol):
    """A module of :data:`MODULES`: its three renderers."""

    @property
    def text(self) -> Renderer: ...

    @property
    def markdown(self) -> Renderer: ...

    @property
    def json(self) -> Renderer: ...


def renderer(module: Renderers, fmt: OutputFormat) -> Renderer:
    """The one branch over :class:`OutputFormat`: ``module``'s renderer for ``fmt``."""
    match fmt:
        case OutputFormat.TEXT:
            return module.text
        case OutputFormat.MARKDOWN:
            return module.markdown
        case OutputFormat.JSON:
            return module.json
        case _:
            assert_never(fmt)
