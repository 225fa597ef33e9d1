"""``envguard restore`` output for a terminal: pure functions of the plan and the check.

Package names, versions, URLs and reasons come from a (possibly hand-edited) snapshot:
they go into ``Text`` objects after ``clean()``, never into markup.
"""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from envguard.render.sanitize import clean
from envguard.restore.plan import CHANGE, INSTALL, KEEP, REMOVE, SKIP, RestorePlan
from envguard.restore.report import CondaRestoreReport
from envguard.restore.verify import Verification

_STYLE = {INSTALL: "green", CHANGE: "yellow", REMOVE: "red", KEEP: "dim", SKIP: "bold red"}


def _cell(value: str | None, limit: int = 80, style: str = "") -> Text:
    return Text("–" if value is None else clean(value, limit), style=style)


def render_plan(plan: RestorePlan, *, show_keep: bool = False) -> RenderableType:
    """The headline counts, one row per package that changes, index hints and notes."""
    head = Text()
    head.append(f"restore {clean(plan.good_name)} ", style="bold")
    head.append(f"(Python {clean(plan.good_python)}) against {clean(plan.current_python)}: ")
    head.append(plan.tally())
    parts: list[RenderableType] = [head]
    rows = [r for r in plan.rows if show_keep or r.action != KEEP]
    if rows:
        table = Table(show_edge=False, pad_edge=False, title_justify="left")
        for col in ("action", "package", "current", "good", "reason"):
            table.add_column(col, overflow="fold")
        for r in rows:
            table.add_row(Text(r.action, style=_STYLE[r.action]), _cell(r.name, 60),
                          _cell(r.current_version, 40, "red"), _cell(r.good_version, 40, "green"),
                          _cell(r.reason, 200))
        parts.append(table)
    if plan.index_hints:
        line = Text("index hints: ", style="bold")
        line.append(" ".join(clean(h) for h in plan.index_hints))
        line.append(" (added as --extra-index-url, --index-strategy unsafe-best-match)"
                    if plan.hints_applied else " (not used: you chose the indexes)", style="dim")
        parts.append(line)
    parts += [Text("note: " + clean(n, 400), style="yellow") for n in plan.notes]
    return Group(*parts)


def render_verification(v: Verification) -> RenderableType:
    """The proof: the restored env matches GOOD's package set, or what it does not."""
    head = Text()
    head.append(f"verify {clean(v.good_name)} → {clean(v.new_name)}: ", style="bold")
    if v.ok:
        head.append("the package set is reproduced exactly (versions and builds)",
                    style="bold green")
    else:
        head.append(f"{len(v.unreproduced)} package difference(s) could not be reproduced",
                    style="bold red")
    parts: list[RenderableType] = [head]
    for u in v.unreproduced:
        line = Text("  • ")
        line.append(clean(u.problem), style="bold red" if u.problem == "build" else "red")
        line.append(": " + clean(u.detail, 800))
        parts.append(line)
    for f in v.findings:
        line = Text("  ")
        line.append(f"[{f.rule}] ", style="dim")
        line.append(clean(f.title, 300))
        for ev in f.evidence[:6]:
            line.append("\n      " + clean(ev, 300), style="dim")
        parts.append(line)
    if v.ignored:
        shown = ", ".join(clean(p, 80) for p in v.ignored[:6])
        more = f" and {len(v.ignored) - 6} more" if len(v.ignored) > 6 else ""
        parts.append(Text(f"  ignored, not packages: {shown}{more}", style="dim"))
    return Group(*parts)


def render_conda(r: CondaRestoreReport) -> str:
    """The files written, then either how to rebuild the prefix by hand or what the rebuilt
    prefix still lacks. Plain lines (paths and names through :func:`clean`)."""
    lines = [f"restore {clean(r.good_name)} (conda: {r.packages} package(s), "
             f"{len(r.pip_requirements)} from pip/uv)",
             f"  wrote {clean(r.explicit)} (@EXPLICIT: exact builds by URL and md5)",
             f"  wrote {clean(r.environment_yml)}"]
    if r.left_out:
        lines.append("  no usable URL recorded, pinned in environment.yml only: "
                     + ", ".join(clean(x, 80) for x in r.left_out))
    if not r.built:
        lines += ["  recreate it with one of:"] + [f"    {clean(c, 600)}" for c in r.commands]
        if r.then:
            lines.append(f"    then: {clean(r.then, 1200)}")
        return "\n".join(lines) + "\n"
    lines.append(f"  built {clean(r.target)} with {clean(r.tool or '?')}")
    lines += ([f"  differs: {clean(d, 400)}" for d in r.differences] if r.differences else
              ["  verified: the conda packages match GOOD (versions and builds)"])
    return "\n".join(lines) + "\n"
