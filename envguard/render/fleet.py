"""``envguard fleet diff`` output: text (a rich renderable), Markdown (for an incident ticket
or a pull request) and JSON (schema ``envguard.fleet-diff/1``, docs/FLEET.md); pure
functions of the report.

Every string from a snapshot goes into ``Text`` objects after ``clean()``.
"""

from __future__ import annotations

from typing import Any

from rich.console import Group as RichGroup
from rich.console import RenderableType
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from envguard.explain import Severity
from envguard.fleet.analyse import FLEET_DIFF_SCHEMA, FleetReport, Group, Member
from envguard.render.diff import change_dict, finding_dict
from envguard.render.markdown import ICON, md
from envguard.render.sanitize import clean, display_value

_STYLE = {Severity.CRITICAL: "bold red", Severity.WARNING: "bold yellow",
          Severity.INFO: "bold blue"}
MAX_LISTED = 32
MAX_CHANGES = 20
MD_MAX_LISTED = 64


def _names(members: tuple[Member, ...]) -> str:
    shown = ", ".join(clean(m.label, 200) for m in members[:MAX_LISTED])
    return shown + (f", … ({len(members) - MAX_LISTED} more)" if len(members) > MAX_LISTED
                    else "")


def _outlier(g: Group) -> RenderableType:
    head = Text()
    who = clean(g.members[0].label, 200) if len(g.members) == 1 else \
        f"{len(g.members)} snapshots ({_names(g.members)})"
    head.append(f"{who} differ{'s' if len(g.members) == 1 else ''}: ", style="bold red")
    head.append(", ".join(f.rule for f in g.findings) or "no known failure mode", style="bold")
    parts: list[RenderableType] = [head]
    for f in g.findings:
        line = Text("  ")
        line.append(f"{f.severity.value.upper():9}", style=_STYLE[f.severity])
        line.append(clean(f.title, 400))
        line.append(f"  [{f.rule}]", style="dim")
        parts.append(line)
        if f.evidence:
            ev = Text("\n".join("• " + clean(e, 400) for e in f.evidence))
            parts.append(Padding(ev, (0, 0, 0, 13)))
    if not g.findings and g.diff.material:
        table = Table(show_edge=False, pad_edge=False, box=None)
        for col in ("change", "baseline", "this group"):
            table.add_column(col, overflow="fold")
        for c in g.diff.material[:MAX_CHANGES]:
            table.add_row(Text(clean(c.path, 100)), Text(clean(display_value(c.old), 100)),
                          Text(clean(display_value(c.new), 100)))
        parts.append(Padding(table, (0, 0, 0, 2)))
    return RichGroup(*parts, Text(""))


def text(report: FleetReport, show_all: bool = False) -> RenderableType:
    verdict = Text("fleet: ", style="bold")
    verdict.append(clean(report.verdict, 300),
                   style="bold green" if report.equivalent else "bold red")
    parts: list[RenderableType] = [verdict]
    base = report.baseline
    line = Text()
    if base.members:
        line.append(f"{len(base.members)} identical", style="green")
        line.append(f" (baseline {clean(report.baseline_name, 200)}, "
                    f"{clean(report.baseline_reason)}): {_names(base.members)}")
    else:
        line.append(f"no snapshot is identical to the baseline "
                    f"{clean(report.baseline_name, 200)}", style="yellow")
    parts += [line, Text("")]
    parts += [_outlier(g) for g in report.outliers]
    parts += [Text(f"note: {clean(n, 500)}", style="dim") for n in report.notes]
    return RichGroup(*parts)

def _md_names(members: tuple[Member, ...]) -> str:
    shown = ", ".join(md(m.label, 200) for m in members[:MD_MAX_LISTED])
    return shown + (f", … ({len(members) - MD_MAX_LISTED} more)" if len(members) > MD_MAX_LISTED
                    else "")


def _md_outlier(g: Group) -> list[str]:
    rules = ", ".join(f"`{f.rule}`" for f in g.findings) or "no known failure mode"
    out = [f"### {len(g.members)} differ: {rules}", "", _md_names(g.members), ""]
    for f in g.findings:
        out += [f"- {ICON[f.severity.value]} **{md(f.title, 500)}** (`{f.rule}`)"]
        out += [f"  - {md(e, 500)}" for e in f.evidence]
    if not g.findings:
        out += [f"- {md(c.path, 200)}: {md(display_value(c.old), 120)} → "
                f"{md(display_value(c.new), 120)}" for c in g.diff.material[:40]]
    return [*out, ""]


def markdown(report: FleetReport, show_all: bool = False) -> str:
    base = report.baseline
    out = ["## envguard fleet diff", "", f"**{md(report.verdict, 300)}**", ""]
    if base.members:
        out += [f"{len(base.members)} identical (baseline {md(report.baseline_name, 200)}, "
                f"{md(report.baseline_reason)}): {_md_names(base.members)}", ""]
    else:
        out += [f"no snapshot is identical to the baseline {md(report.baseline_name, 200)}", ""]
    for g in report.outliers:
        out += _md_outlier(g)
    out += [f"> note: {md(n, 500)}" for n in report.notes]
    return "\n".join(out).rstrip("\n") + "\n"


def member_dict(m: Member) -> dict[str, Any]:
    return {"name": m.name, "rank": m.rank, "host": m.host, "label": m.label}


def json(report: FleetReport, show_all: bool = False) -> str:
    from envguard.render import json_text

    doc = {
        "schema": FLEET_DIFF_SCHEMA,
        "equivalent": report.equivalent,
        "verdict": report.verdict,
        "total": report.total,
        "baseline": {"name": report.baseline_name, "reason": report.baseline_reason,
                     "members": [member_dict(m) for m in report.baseline.members]},
        "outliers": [{"members": [member_dict(m) for m in g.members],
                      "rules": [f.rule for f in g.findings],
                      "findings": [finding_dict(f) for f in g.findings],
                      "changes": [change_dict(c) for c in g.diff.material]}
                     for g in report.outliers],
        "ignored_variables": list(report.ignored_variables),
        "notes": list(report.notes),
    }
    return json_text(doc)
