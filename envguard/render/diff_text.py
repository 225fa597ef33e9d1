"""Default ``envguard diff`` output: a rich renderable, a pure function of the report.

Every string from a snapshot goes into ``Text`` objects after ``clean()``: no markup
is interpreted and no terminal escape reaches the terminal.
"""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from envguard.changes import Change
from envguard.explain import Finding, Severity
from envguard.render.report import DiffReport
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


def render(report: DiffReport, *, show_all: bool = False) -> RenderableType:
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
