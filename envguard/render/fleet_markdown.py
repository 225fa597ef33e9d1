"""``envguard fleet diff --format markdown``: for an incident ticket or a pull request."""

from __future__ import annotations

from envguard.fleet.analyse import FleetReport, Group, Member
from envguard.render.diff_markdown import md
from envguard.render.sanitize import display_value

_ICON = {"critical": "🔴", "warning": "🟡", "info": "🔵"}
MAX_LISTED = 64


def _names(members: tuple[Member, ...]) -> str:
    shown = ", ".join(md(m.label, 200) for m in members[:MAX_LISTED])
    return shown + (f", … ({len(members) - MAX_LISTED} more)" if len(members) > MAX_LISTED
                    else "")


def _outlier(g: Group) -> list[str]:
    rules = ", ".join(f"`{f.rule}`" for f in g.findings) or "no known failure mode"
    out = [f"### {len(g.members)} differ: {rules}", "", _names(g.members), ""]
    for f in g.findings:
        out += [f"- {_ICON[f.severity.value]} **{md(f.title, 500)}** (`{f.rule}`)"]
        out += [f"  - {md(e, 500)}" for e in f.evidence]
    if not g.findings:
        out += [f"- {md(c.path, 200)}: {md(display_value(c.old), 120)} → "
                f"{md(display_value(c.new), 120)}" for c in g.diff.material[:40]]
    return [*out, ""]


def render(report: FleetReport) -> str:
    base = report.baseline
    out = ["## envguard fleet diff", "", f"**{md(report.verdict, 300)}**", ""]
    if base.members:
        out += [f"{len(base.members)} identical (baseline {md(report.baseline_name, 200)}, "
                f"{md(report.baseline_reason)}): {_names(base.members)}", ""]
    else:
        out += [f"no snapshot is identical to the baseline {md(report.baseline_name, 200)}", ""]
    for g in report.outliers:
        out += _outlier(g)
    out += [f"> note: {md(n, 500)}" for n in report.notes]
    return "\n".join(out).rstrip("\n") + "\n"
