"""``envguard check`` and ``run`` output: pure functions of the gate's result.

A match is two plain lines (no rich: it would cost 40 ms of the gate's budget). A refusal
in text is a summary of at most about 20 lines: the verdict, the first findings one line
each, the changes counted per section with their first few keys, and at the end the one
command to run next (re-lock, bless a new machine, or remove what the lock forbids).
``show_all`` (``--verbose``) gives the closest entry's whole diff report
(:meth:`GateResult.diff_report`) before that ending; Markdown and JSON are always that
whole report, rendered as ``envguard diff`` renders one.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from envguard.render.sanitize import clean

if TYPE_CHECKING:
    from rich.console import RenderableType

    from envguard.changes import Change
    from envguard.explain.report import DiffReport
    from envguard.gate.check import GateResult

MAX_FINDINGS = 5
MAX_SECTIONS = 5
MAX_KEYS = 3
"""Keys named per section of the summary; the rest are counted."""


def text(result: GateResult, show_all: bool = False) -> str | RenderableType:
    if not result.passed or result.matched is None:
        report = result.diff_report()
        if show_all:
            from rich.console import Group
            from rich.text import Text

            from envguard.render import diff

            return Group(diff.text(report, show_all=True), Text(_ending(result)))
        return summary(result, report)
    lines = [f"envguard: matches entry {clean(result.matched.entry.id)} of "
             f"{clean(result.lock_path)}"]
    lines += [f"envguard: warning: {clean(f.title, 300)} [{f.rule}]" for f in result.findings]
    return "\n".join(lines) + "\n"


def summary(result: GateResult, report: DiffReport) -> str:
    """The refusal in at most about 20 lines, ending with the command to run next."""
    lines = [f"{clean(report.old_name)} → this environment: {clean(report.verdict, 300)}"]
    for f in report.findings[:MAX_FINDINGS]:
        lines.append(f"  {f.severity.value.upper():8} {clean(f.title, 200)}  [{f.rule}]")
    if len(report.findings) > MAX_FINDINGS:
        lines.append(f"  … and {len(report.findings) - MAX_FINDINGS} more finding(s)")
    sections = _by_section(report.diff.material)
    if sections:
        total = sum(len(v) for v in sections.values())
        lines.append(f"{total} change(s):")
        for section, changes in list(sections.items())[:MAX_SECTIONS]:
            keys = [_item(c, result.project_root) for c in changes[:MAX_KEYS]]
            more = f" and {len(changes) - MAX_KEYS} more" if len(changes) > MAX_KEYS else ""
            lines.append(f"  {section} ({len(changes)}): {', '.join(keys)}{more}")
        if len(sections) > MAX_SECTIONS:
            lines.append(f"  … and {len(sections) - MAX_SECTIONS} more section(s)")
    return "\n".join(lines) + "\n" + _ending(result)


def _by_section(changes: tuple[Change, ...]) -> dict[str, list[Change]]:
    """The changes of each section, one per key (a package's version and build are one)."""
    out: dict[str, dict[str, Change]] = {}
    for c in changes:
        out.setdefault(c.section, {}).setdefault(c.key, c)
    return {section: list(keys.values()) for section, keys in out.items()}


def _item(c: Change, root: str) -> str:
    key = c.key
    if c.section == "files" and root and os.path.isabs(key):
        rel = os.path.relpath(key, root)  # a string operation: no file is looked at
        key = rel if not rel.startswith("..") else key
    key = clean(key, 80)
    if c.kind == "added":
        return f"{key} (new)"
    if c.kind == "removed":
        return f"{key} (gone)"
    if c.section == "packages" and c.field == "version":
        return f"{key} {clean(str(c.old), 40)} → {clean(str(c.new), 40)}"
    return f"{key} ({c.field})" if c.field else key


def _ending(result: GateResult) -> str:
    """How to see all of it, then what to do: the command alone on the last line."""
    from envguard.explain.remedies import shell_line

    every = shell_line(["envguard", "check", *(result.relock or (result.lock.name,)),
                        "--verbose"])
    lines = [f"every finding and change: {every} (or --format json)"]
    if result.next_step is not None:
        lines += [clean(result.next_step.why, 300), f"  {clean(result.next_step.command, 500)}"]
    return "\n".join(lines) + "\n"


def markdown(result: GateResult, show_all: bool = False) -> str:
    from envguard.render import diff

    return diff.markdown(result.diff_report(), show_all)


def json(result: GateResult, show_all: bool = False) -> str:
    from envguard.render import diff

    return diff.json(result.diff_report(), show_all)
