"""Renderers: pure functions from plain data to text.

:func:`render` is the one place where an output format is chosen. Every command hands
it its report and the ``--format`` asked for, and writes the string it gets back:

============================  ==========================  =====================
report                        text                        json / markdown
============================  ==========================  =====================
``DiffReport`` (diff)         :mod:`.diff_text`            :mod:`.diff_json`,
                                                           :mod:`.diff_markdown`
``GateResult`` (check, run)   :mod:`.gate_text`            the closest entry's
                                                           ``DiffReport``
``FleetReport`` (fleet)       :mod:`.fleet_text`           :mod:`.fleet_json`,
                                                           :mod:`.fleet_markdown`
``CacheStatus`` (cache)       :mod:`.cache_text`           ``to_dict``,
                                                           :mod:`.state_markdown`
``RestoreReport`` (restore)   :mod:`.restore_text`         ``to_dict``,
                                                           :mod:`.state_markdown`
``CondaRestoreReport``        :mod:`.restore_text`         ``to_dict``,
(restore of a conda env)                                   :mod:`.state_markdown`
``RunList`` (runs)            :mod:`.runs_text`            ``to_dict``,
                                                           :mod:`.state_markdown`
``DoctorReport`` (doctor)     :mod:`.doctor_views`         :mod:`.doctor_views`
``Timeline`` (history)        :mod:`.doctor_views`         :mod:`.doctor_views`
``BisectReport`` (bisect)     :mod:`.bisect_views`         json: its ``to_dict``,
                                                           :mod:`.bisect_views`
============================  ==========================  =====================

A report's type is recognised by name, so that rendering one kind of report imports
nothing of the others (the gate's happy path must not even import rich).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from envguard.errors import InputError
from envguard.frozen import frozen
from envguard.render.formats import OutputFormat

if TYPE_CHECKING:
    from rich.console import RenderableType

    from envguard.bisection.report import BisectReport
    from envguard.cache.store import CacheStatus
    from envguard.doctor import DoctorReport
    from envguard.fleet.analyse import FleetReport
    from envguard.gate.check import GateResult
    from envguard.history import Timeline
    from envguard.render.report import DiffReport
    from envguard.restore.report import CondaRestoreReport, RestoreReport
    from envguard.runs.store import RunList

    Report = (DiffReport | GateResult | FleetReport | CacheStatus | RestoreReport
              | CondaRestoreReport | RunList | DoctorReport | Timeline | BisectReport)

__all__ = ["PLAIN", "OutputFormat", "PlainScreen", "Screen", "json_text", "render", "to_text"]


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
    kind = type(report).__name__
    out = _KINDS[kind](report, fmt, show_all)
    if out is None:
        raise InputError(f"{kind}: no {fmt.value} output")
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


def _diff(report: DiffReport, fmt: OutputFormat, show_all: bool) -> str | RenderableType:
    if fmt is OutputFormat.JSON:
        from envguard.render import diff_json

        return diff_json.render(report)
    if fmt is OutputFormat.MARKDOWN:
        from envguard.render import diff_markdown

        return diff_markdown.render(report, show_all=show_all)
    from envguard.render import diff_text

    return diff_text.render(report, show_all=show_all)


def _gate(result: GateResult, fmt: OutputFormat, show_all: bool) -> str | RenderableType:
    from envguard.render import gate_text

    if fmt is OutputFormat.TEXT:
        return gate_text.render(result)
    return _diff(gate_text.diff_report(result), fmt, show_all)


def _fleet(report: FleetReport, fmt: OutputFormat, show_all: bool) -> str | RenderableType:
    if fmt is OutputFormat.JSON:
        from envguard.render import fleet_json

        return fleet_json.render(report)
    if fmt is OutputFormat.MARKDOWN:
        from envguard.render import fleet_markdown

        return fleet_markdown.render(report)
    from envguard.render import fleet_text

    return fleet_text.render(report)


def _cache_status(st: CacheStatus, fmt: OutputFormat, show_all: bool) -> str | RenderableType:
    if fmt is OutputFormat.JSON:
        return json_text(st.to_dict())
    if fmt is OutputFormat.MARKDOWN:
        from envguard.render import state_markdown

        return state_markdown.cache_status(st)
    from envguard.render import cache_text

    return cache_text.status_view(st)


def _restore(report: RestoreReport, fmt: OutputFormat, show_all: bool) -> str | RenderableType:
    if fmt is OutputFormat.JSON:
        return json_text(report.to_dict())
    if fmt is OutputFormat.MARKDOWN:
        from envguard.render import state_markdown

        return state_markdown.restore(report, show_all=show_all)
    from envguard.render import restore_text

    if report.verification is not None:
        return restore_text.render_verification(report.verification)
    return restore_text.render_plan(report.plan, show_keep=show_all)


def _conda_restore(report: CondaRestoreReport, fmt: OutputFormat, show_all: bool) -> str:
    if fmt is OutputFormat.JSON:
        return json_text(report.to_dict())
    if fmt is OutputFormat.MARKDOWN:
        from envguard.render import state_markdown

        return state_markdown.conda_restore(report)
    from envguard.render import restore_text

    return restore_text.render_conda(report)


def _runs(report: RunList, fmt: OutputFormat, show_all: bool) -> str | RenderableType:
    if fmt is OutputFormat.JSON:
        return json_text(report.to_dict())
    if fmt is OutputFormat.MARKDOWN:
        from envguard.render import state_markdown

        return state_markdown.runs(report)
    from envguard.render import runs_text

    return runs_text.render(report)


def _doctor(report: DoctorReport, fmt: OutputFormat, show_all: bool) -> str | RenderableType:
    from envguard.render import doctor_views

    if fmt is OutputFormat.JSON:
        return doctor_views.doctor_json(report)
    if fmt is OutputFormat.MARKDOWN:
        return doctor_views.doctor_markdown(report)
    return doctor_views.doctor_text(report)


def _history(timeline: Timeline, fmt: OutputFormat, show_all: bool) -> str | RenderableType:
    from envguard.render import doctor_views

    if fmt is OutputFormat.JSON:
        return doctor_views.history_json(timeline)
    if fmt is OutputFormat.MARKDOWN:
        return doctor_views.history_markdown(timeline)
    return doctor_views.history_text(timeline)


def _bisect(report: BisectReport, fmt: OutputFormat, show_all: bool) -> str | RenderableType:
    if fmt is OutputFormat.JSON:
        return json_text(report.to_dict())
    from envguard.render import bisect_views

    if fmt is OutputFormat.MARKDOWN:
        return bisect_views.markdown(report)
    return bisect_views.text(report)


_KINDS: dict[str, Callable[[Any, OutputFormat, bool], str | RenderableType | None]] = {
    "DiffReport": _diff, "GateResult": _gate, "FleetReport": _fleet,
    "CacheStatus": _cache_status, "RestoreReport": _restore,
    "CondaRestoreReport": _conda_restore, "RunList": _runs,
    "DoctorReport": _doctor, "Timeline": _history, "BisectReport": _bisect,
}
