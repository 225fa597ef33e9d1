"""``envguard diff`` output: text (a rich renderable), Markdown (for pasting into an issue
or a pull request) and JSON (a stable, documented schema: docs/DIFF.md); pure functions
of the report.

Every string from a snapshot goes into ``Text`` objects after ``clean()``: no markup
is interpreted and no terminal escape reaches the terminal.
"""

from __future__ import annotations

from typing import Any

from rich.console import Group, RenderableType
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from envguard.changes import Change
from envguard.explain import Finding, Severity
from envguard.explain.report import DIFF_SCHEMA, DiffReport
from envguard.render.markdown import ICON, md
from envguard.render.sanitize import clean, display_value

_STYLE = {Severity.CRITICAL: "bold red", Severity.WARNING: "bold yellow",
          Severity.INFO: "bold blue"}
MAX_CHANGES = 40
MAX_EVIDENCE = 40
"""Evidence lines a finding shows in text (``--all``: every one; JSON has them all)."""


def finding_view(f: Finding, *, show_all: bool = False) -> RenderableType:
    """One finding: severity, title and rule id, explanation, evidence (the first
    :data:`MAX_EVIDENCE` lines unless ``show_all``), remedy."""
    head = Text()
    head.append(f"{f.severity.value.upper():9}", style=_STYLE[f.severity])
    head.append(clean(f.title, 400), style="bold")
    head.append(f"  [{f.rule}]", style="dim")
    parts: list[RenderableType] = [head, Padding(Text(clean(f.explanation, 2000)), (0, 0, 0, 8))]
    # One Text a line: rich renders one Text as one segment that it splits at each line
    # break with str.partition, which is quadratic in the number of lines.
    if f.evidence:
        shown = f.evidence if show_all else f.evidence[:MAX_EVIDENCE]
        lines = [Text("• " + clean(line, 400)) for line in shown]
        if len(shown) < len(f.evidence):
            lines.append(Text(f"… {len(f.evidence) - len(shown)} more (--all for every one)",
                              style="dim"))
        parts.append(Padding(Group(*lines), (0, 0, 0, 8)))
    if f.remedy:
        steps = [Text("Remedy:", style="bold green")]
        for i, step in enumerate(f.remedy, 1):
            steps.append(Text.assemble((f"{i}. ", "green"), clean(step, 500)))
        parts.append(Padding(Group(*steps), (0, 0, 0, 8)))
    return Group(*parts, Text(""))


def _changes_table(changes: tuple[Change, ...], total: int) -> RenderableType:
    table = Table(title=f"{total} change(s)" + ("" if len(changes) == total else
                                                f", {len(changes)} shown (--all for every one)"),
                  title_justify="left", show_edge=False, pad_edge=False)
    for col in ("section", "key", "old", "new"):
        table.add_column(col, overflow="fold")
    for c in changes:
        key = c.key + (f" · {c.field}" if c.field else "")
        table.add_row(Text(clean(c.section)), Text(clean(key, 100)),
                      Text(clean(display_value(c.old), 120), style="red"),
                      Text(clean(display_value(c.new), 120), style="green"))
    return table


def text(report: DiffReport, show_all: bool = False) -> RenderableType:
    verdict = Text()
    verdict.append(f"{clean(report.old_name)} → {clean(report.new_name)}: ", style="bold")
    verdict.append(clean(report.verdict, 600),
                   style="bold green" if report.equivalent else "bold red")
    parts: list[RenderableType] = [verdict, Text("")]
    if report.symptom:
        parts.insert(1, Text(f"symptom: {clean(report.symptom, 300)}", style="dim"))
    parts += [finding_view(f, show_all=show_all) for f in report.findings]
    pool = report.diff.changes if show_all else report.diff.material
    if pool:
        shown = pool if show_all else pool[:MAX_CHANGES]
        parts.append(_changes_table(tuple(shown), len(pool)))
    return Group(*parts)


def _change_row(c: Change) -> str:
    return f"| {md(c.section)} | {md(c.key, 80)} | {md(c.field or '')} | {md(c.kind)} | " \
           f"{md(display_value(c.old), 120)} | {md(display_value(c.new), 120)} |"


def finding_lines(f: Finding) -> list[str]:
    """One finding as Markdown: a heading with severity and rule id, then its text."""
    out = [f"### {ICON[f.severity.value]} {f.severity.value}: {md(f.title, 500)} "
           f"(`{f.rule}`)", "", md(f.explanation, 2000), ""]
    if f.evidence:
        out += ["Evidence:", ""] + [f"- {md(e, 500)}" for e in f.evidence] + [""]
    if f.remedy:
        out += ["Remedy:", ""] + [f"{i}. {md(r, 500)}" for i, r in enumerate(f.remedy, 1)]
        out += [""]
    return out


def markdown(report: DiffReport, show_all: bool = False) -> str:
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


def change_dict(c: Change) -> dict[str, Any]:
    return {"section": c.section, "key": c.key, "field": c.field, "kind": c.kind,
            "old": c.old, "new": c.new, "material": c.material, "path": c.path}


def finding_dict(f: Finding) -> dict[str, Any]:
    return {"rule": f.rule, "severity": f.severity.value, "title": f.title,
            "explanation": f.explanation, "evidence": list(f.evidence),
            "remedy": list(f.remedy), "changes": [c.path for c in f.changes]}


def json(report: DiffReport, show_all: bool = False) -> str:
    from envguard.render import json_text

    return json_text({
        "schema": DIFF_SCHEMA,
        "old": report.old_name,
        "new": report.new_name,
        "equivalent": report.equivalent,
        "verdict": report.verdict,
        "symptom": report.symptom,
        "findings": [finding_dict(f) for f in report.findings],
        "changes": [change_dict(c) for c in report.diff.changes],
    })
