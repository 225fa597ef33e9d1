"""Default ``envguard fleet diff`` output: a rich renderable, a pure function of the report.

Every string from a snapshot goes into ``Text`` objects after ``clean()``.
"""

from __future__ import annotations

from rich.console import Group as RichGroup
from rich.console import RenderableType
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from envguard.explain import Severity
from envguard.fleet.analyse import FleetReport, Group, Member
from envguard.render.sanitize import clean, display_value

_STYLE = {Severity.CRITICAL: "bold red", Severity.WARNING: "bold yellow",
          Severity.INFO: "bold blue"}
MAX_LISTED = 32
MAX_CHANGES = 20


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


def render(report: FleetReport) -> RenderableType:
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
