"""``envguard check`` and ``run`` output: pure functions of the gate's result.

A match is two plain lines (no rich: it would cost 40 ms of the gate's budget); a
mismatch, and every Markdown or JSON output, is the closest entry's diff report
(:meth:`GateResult.diff_report`), rendered as ``envguard diff`` renders one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from envguard.render.sanitize import clean

if TYPE_CHECKING:
    from rich.console import RenderableType

    from envguard.gate.check import GateResult


def text(result: GateResult, show_all: bool = False) -> str | RenderableType:
    if not result.passed or result.matched is None:
        from envguard.render import diff

        return diff.text(result.diff_report())
    lines = [f"envguard: matches entry {clean(result.matched.entry.id)} of "
             f"{clean(result.lock_path)}"]
    lines += [f"envguard: warning: {clean(f.title, 300)} [{f.rule}]" for f in result.findings]
    return "\n".join(lines) + "\n"


def markdown(result: GateResult, show_all: bool = False) -> str:
    from envguard.render import diff

    return diff.markdown(result.diff_report(), show_all)


def json(result: GateResult, show_all: bool = False) -> str:
    from envguard.render import diff

    return diff.json(result.diff_report(), show_all)
