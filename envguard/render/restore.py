"""``envguard restore`` output: text for a terminal, Markdown (for pasting into an issue) and
JSON; pure functions of the plan and the check, of a venv (``RestoreReport``) or of a conda
prefix (``CondaRestoreReport``).

Package names, versions, URLs and reasons come from a (possibly hand-edited) snapshot:
they go into ``Text`` objects after ``clean()``, never into markup.
"""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from envguard.render.markdown import md, md_table
from envguard.render.sanitize import REASON_LIMIT, clean
from envguard.restore.plan import CHANGE, INSTALL, KEEP, REMOVE, SKIP, RestorePlan
from envguard.restore.report import CondaRestoreReport, RestoreReport
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
                          _cell(r.reason, REASON_LIMIT))
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
        head.append("the package set is reproduced exactly (versions, builds and files)",
                    style="bold green")
    else:
        head.append(f"{len(v.unreproduced)} package difference(s) could not be reproduced",
                    style="bold red")
    parts: list[RenderableType] = [head]
    for u in v.unreproduced:
        line = Text("  • ")
        line.append(clean(u.problem), style="bold red" if u.problem == "build" else "red")
        line.append(": " + clean(u.detail, REASON_LIMIT))
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


def text(report: RestoreReport | CondaRestoreReport, show_all: bool = False
         ) -> str | RenderableType:
    if isinstance(report, CondaRestoreReport):
        return render_conda(report)
    if report.verification is not None:
        return render_verification(report.verification)
    return render_plan(report.plan, show_keep=show_all)


def markdown(report: RestoreReport | CondaRestoreReport, show_all: bool = False) -> str:
    if isinstance(report, CondaRestoreReport):
        return _markdown_conda(report)
    return _markdown_venv(report, show_all)


def json(report: RestoreReport | CondaRestoreReport, show_all: bool = False) -> str:
    from envguard.render import json_text

    return json_text(report.to_dict())


def _markdown_venv(report: RestoreReport, show_all: bool) -> str:
    plan = report.plan
    out = [f"## envguard restore: {md(plan.good_name)}", "",
           f"GOOD has Python {md(plan.good_python)}; planned against "
           f"`{md(plan.current_python)}`: {plan.tally()}.", ""]
    rows = [(md(r.action), md(r.name, 80), md(r.current_version or "–", 60),
             md(r.good_version or "–", 60), md(r.reason, 300))
            for r in plan.rows if show_all or r.action != KEEP]
    if rows:
        out += md_table(("action", "package", "current", "good", "reason"), rows)
    if plan.index_hints:
        used = "added to the install" if plan.hints_applied else "not used: you chose the indexes"
        out += ["Index hints (" + used + "): " + ", ".join(f"`{md(h)}`" for h in plan.index_hints),
                ""]
    out += [f"- note: {md(n, 600)}" for n in plan.notes] + ([""] if plan.notes else [])
    v = report.verification
    if v is not None:
        verdict = ("the package set is reproduced exactly (versions, builds and files)" if v.ok else
                   f"{len(v.unreproduced)} package difference(s) could not be reproduced")
        out += [f"### Verified {md(v.good_name)} → {md(v.new_name)}", "", f"**{verdict}**", ""]
        out += [f"- {md(u.problem)}: {md(u.detail, 800)}" for u in v.unreproduced]
        out += [f"- `{md(f.rule)}` {md(f.title, 300)}" for f in v.findings]
        out.append("")
    return "\n".join(out)


def _markdown_conda(r: CondaRestoreReport) -> str:
    out = [f"## envguard restore: {md(r.good_name)} (conda)", "",
           f"{r.packages} conda package(s), {len(r.pip_requirements)} from pip/uv.", "",
           f"- wrote `{md(r.explicit)}` (@EXPLICIT: exact builds by URL and md5)",
           f"- wrote `{md(r.environment_yml)}`"]
    if r.left_out:
        out.append("- no usable URL recorded, pinned in environment.yml only: "
                   + ", ".join(md(x, 80) for x in r.left_out))
    out.append("")
    if not r.built:
        out += ["Recreate it with one of:", "", "```console"]
        out += [c.replace("```", "'''") for c in r.commands] + ["```", ""]
        if r.then:
            out += ["Then install the pip part:", "", "```console",
                    r.then.replace("```", "'''"), "```", ""]
        return "\n".join(out)
    out.append(f"Built `{md(r.target)}` with {md(r.tool or '?')}: "
               + ("**the conda packages match GOOD** (versions and builds)." if not r.differences
                  else f"**{len(r.differences)} difference(s)**:"))
    out += [""] + [f"- {md(d, 400)}" for d in r.differences]
    return "\n".join(out) + "\n"
