"""``--format markdown``: for pasting into an issue or a pull request."""

from __future__ import annotations

import re

from envguard.changes import Change
from envguard.findings import Finding
from envguard.render.report import DiffReport
from envguard.render.sanitize import clean, display_value

_SPECIAL = re.compile(r"([\\`*_\[\]<>|~])")
_ICON = {"critical": "🔴", "warning": "🟡", "info": "🔵"}


def md(value: object, limit: int = 300) -> str:
    """Inert markdown text: control characters shown, markup characters escaped."""
    return _SPECIAL.sub(r"\\\1", clean(value, limit))


def _change_row(c: Change) -> str:
    return f"| {md(c.section)} | {md(c.key, 80)} | {md(c.field or '')} | {md(c.kind)} | " \
           f"{md(display_value(c.old), 120)} | {md(display_value(c.new), 120)} |"


def finding_lines(f: Finding) -> list[str]:
    """One finding as Markdown: a heading with severity and rule id, then its text."""
    out = [f"### {_ICON[f.severity.value]} {f.severity.value}: {md(f.title, 500)} "
           f"(`{f.rule}`)", "", md(f.explanation, 2000), ""]
    if f.evidence:
        out += ["Evidence:", ""] + [f"- {md(e, 500)}" for e in f.evidence] + [""]
    if f.remedy:
        out += ["Remedy:", ""] + [f"{i}. {md(r, 500)}" for i, r in enumerate(f.remedy, 1)]
        out += [""]
    return out


def render(report: DiffReport, *, show_all: bool = False) -> str:
    out = [f"## envguard diff: {md(report.old_name)} → {md(report.new_name)}", "",
           f"**{md(report.verdict, 500)}**", ""]
    if report.symptom:
        out += [f"Symptom: `{clean(report.symptom, 200).replace('`', chr(39))}`", ""]
    for f in report.findings:
        out += finding_lines(f)
    changes = report.diff.changes if show_all else report.diff.material
    if changes:
        out += ["<details><summary>" + f"{len(changes)} change(s)" + "</summary>", "",
                "| section | key | field | kind | old | new |", "|---|---|---|---|---|---|"]
        out += [_change_row(c) for c in changes] + ["", "</details>", ""]
    return "\n".join(out)
