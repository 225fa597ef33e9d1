"""``envguard install`` output: the prediction in a few lines (what changes, the findings
that matter, the verdict), then how the real change compared. Text, Markdown and JSON;
pure. Names, versions and commands come from the environment and the user: each goes
through :func:`clean` into ``Text``, never into markup."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.text import Text

from envguard.findings import Severity
from envguard.install.report import InstallReport
from envguard.render.markdown import ICON, md, md_table
from envguard.render.sanitize import REASON_LIMIT, clean

_MARK = {"install": "+", "remove": "-", "change": "~", "rebuild": "!"}
_STYLE = {"install": "green", "remove": "red", "change": "yellow", "rebuild": "bold red"}


def _versions(before: str | None, after: str | None) -> str:
    if before and after:
        return f"{before} → {after}" if before != after else before
    return before or after or ""


def _command(report: InstallReport) -> str:
    import shlex

    return shlex.join(report.plan.command)


def text(report: InstallReport, show_all: bool = False) -> RenderableType:
    """The prediction; once applied, only the outcome (the command line printed the
    prediction before it ran the installer)."""
    if report.applied is not None:
        return _outcome(report)
    plan = report.plan
    lines: list[RenderableType] = []
    head = Text("predicted: ", style="bold")
    head.append(clean(_command(report), 200))
    head.append(f" ({clean(plan.environment, 200)})", style="dim")
    lines.append(head)
    for p in plan.packages:
        row = Text(f"  {_MARK.get(p.action, '?')} ", style=_STYLE.get(p.action, ""))
        row.append(f"{clean(p.name, 80)} {clean(_versions(p.before, p.after), 80)}")
        if p.detail:
            row.append(f" ({clean(p.detail, REASON_LIMIT)})", style="dim")
        lines.append(row)
    shown = plan.findings if show_all else tuple(
        f for f in plan.findings if f.severity is not Severity.INFO)
    for f in shown:
        row = Text(f"  {f.severity.value} ", style="bold red" if f.severity is Severity.CRITICAL
                   else "yellow")
        row.append(f"{f.rule}: {clean(f.title, 200)}")
        lines.append(row)
        if f.severity is Severity.CRITICAL and f.remedy:
            lines.append(Text(f"    remedy: {clean(f.remedy[0], 300)}", style="dim"))
    for v in plan.locks:
        row = Text("  lock ", style="bold red")
        row.append(f"{clean(v.name, 80)} ({clean(v.path, 200)}) would refuse: "
                   + clean("; ".join(f.title for f in v.findings[:3]) or "no entry matches",
                           300))
        lines.append(row)
    lines += [Text(f"  note: {clean(n, 300)}", style="yellow") for n in plan.notes]
    verdict = Text(report.verdict, style="bold red" if plan.refused else "bold")
    if plan.refused:
        verdict.append(" — nothing was changed (envguard install --yes takes it anyway)",
                       style="")
    lines.append(verdict)
    return Group(*lines)


def _outcome(report: InstallReport) -> RenderableType:
    applied = report.applied
    assert applied is not None  # noqa: S101 - the caller checked
    lines: list[RenderableType] = [Text(report.verdict, style="bold" if not applied.differences
                                        and applied.exit_code == 0 else "bold yellow")]
    lines += [Text(f"  differs: {clean(d, 300)}", style="yellow") for d in applied.differences]
    if applied.why_run:
        lines.append(Text(f"  the installer ran again in the environment: "
                          f"{clean(applied.why_run, REASON_LIMIT)}", style="dim"))
    for k in applied.kept:
        row = Text(f"  {'kept for undo' if k.outcome != 'not kept' else 'not kept for undo'}: ",
                   style="dim" if k.outcome != "not kept" else "yellow")
        row.append(f"{clean(k.name, 80)} {clean(k.version or '', 40)}")
        if k.outcome == "not kept":
            row.append(f" ({clean(k.detail, REASON_LIMIT)}; envguard undo cannot put it back)")
        lines.append(row)
    if applied.revision is not None:
        lines.append(Text(f"recorded as revision {applied.revision.number} (envguard "
                          "revisions; envguard undo returns to the state before)", style="dim"))
    return Group(*lines)


def markdown(report: InstallReport, show_all: bool = False) -> str:
    plan = report.plan
    out = ["## envguard install", "", f"`{md(_command(report), 300)}` in `{md(plan.environment)}`",
           "", f"**{md(report.verdict)}**", ""]
    if plan.packages:
        out += md_table(("action", "package", "versions", "detail"),
                        [(p.action, md(p.name), md(_versions(p.before, p.after)), md(p.detail))
                         for p in plan.packages])
    for f in plan.findings:
        if f.severity is Severity.INFO and not show_all:
            continue
        out.append(f"- {ICON[f.severity.value]} **{md(f.rule)}**: {md(f.title)}")
    for v in plan.locks:
        out.append(f"- 🔒 lock **{md(v.name)}** (`{md(v.path)}`) would refuse")
    if report.applied is not None:
        out += [f"- differs from the prediction: {md(d)}" for d in report.applied.differences]
        if report.applied.why_run:
            out.append(f"- the installer ran again in the environment: "
                       f"{md(report.applied.why_run)}")
        out += [f"- {'not kept' if k.outcome == 'not kept' else 'kept'} for undo: "
                f"{md(k.name)} {md(k.version or '')}"
                + (f" ({md(k.detail)})" if k.outcome == "not kept" else "")
                for k in report.applied.kept]
        if report.applied.revision is not None:
            out.append(f"- recorded as revision {report.applied.revision.number}")
    return "\n".join([*out, ""])


def json(report: InstallReport, show_all: bool = False) -> str:
    from envguard.render import json_text

    return json_text(report.to_dict())
