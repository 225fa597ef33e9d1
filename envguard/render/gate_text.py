"""``envguard check`` and ``run`` output: a pure function of the gate's result.

A match is two plain lines (no rich: it would cost 40 ms of the gate's budget); a
mismatch is the closest entry's diff report, rendered as ``envguard diff`` renders one.
On a new machine the report lists no changes (another machine's package set is not a
change), only the ``new-machine`` finding that says how to bless this environment.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from envguard.changes import SnapshotDiff
from envguard.errors import InputError
from envguard.render.report import DiffReport
from envguard.render.sanitize import clean

if TYPE_CHECKING:
    from rich.console import RenderableType

    from envguard.gate.check import GateResult


def diff_report(result: GateResult) -> DiffReport:
    """The matched (or else the closest) entry against this environment."""
    closest = result.matched or result.closest
    if closest is None:
        raise InputError(f"{result.lock_path}: the lock has no environment entries")
    blocking = result.cache_note if (result.cache_note is not None and not result.passed
                                     and result.matched is not None) else None
    if result.new_machine is not None:
        return DiffReport(old_name=f"{result.lock_path} [{closest.entry.id}]",
                          new_name="this environment", diff=SnapshotDiff(changes=()),
                          findings=result.findings,
                          refused_by=next(f.title for f in result.findings
                                          if f.rule == "new-machine"))
    return DiffReport(old_name=f"{result.lock_path} [{closest.entry.id}]",
                      new_name="this environment", diff=closest.diff,
                      findings=result.findings,
                      refused_by=blocking.title if blocking is not None else None)


def render(result: GateResult) -> str | RenderableType:
    if not result.passed or result.matched is None:
        from envguard.render import diff_text

        return diff_text.render(diff_report(result))
    lines = [f"envguard: matches entry {clean(result.matched.entry.id)} of "
             f"{clean(result.lock_path)}"]
    lines += [f"envguard: warning: {clean(f.title, 300)} [{f.rule}]" for f in result.findings]
    return "\n".join(lines) + "\n"
