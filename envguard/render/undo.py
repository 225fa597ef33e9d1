"""``envguard undo`` output: the plan (restore's table), where each build comes from, and
the proofs: the scratch copy's, then the environment's. Text, Markdown and JSON; pure.
Names and paths come from snapshots on disk: each goes through :func:`clean`."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.text import Text

from envguard.render.markdown import md
from envguard.render.restore import render_plan, render_verification
from envguard.render.sanitize import REASON_LIMIT, clean
from envguard.revisions.undo import UndoReport


def _verdict(report: UndoReport) -> str:
    if report.missing:
        names = ", ".join(f"{s.name} {s.version or ''}".strip() for s in report.missing)
        return f"cannot undo: no exact build of {names}; nothing was changed"
    if report.scratch is not None and not report.scratch.ok:
        return "cannot undo: the scratch copy did not reproduce the revision; nothing was changed"
    if report.dry_run:
        return f"would return {report.environment} to revision {report.target}"
    if report.verification is None:
        return "nothing to do"
    if report.verification.ok:
        return (f"returned to revision {report.target} exactly (versions, builds and files)"
                + (f"; recorded as revision {report.revision.number}" if report.revision
                   else ""))
    return f"returned to revision {report.target}, but not exactly: see above"


def text(report: UndoReport, show_all: bool = False) -> RenderableType:
    parts: list[RenderableType] = [render_plan(report.plan, show_keep=show_all)]
    for s in report.sources:
        row = Text(f"  {clean(s.name, 80)} {clean(s.version or '', 40)}: ")
        row.append(clean(s.source, 40), style="bold red" if s.source == "not found" else "green")
        if s.detail:
            row.append(f" ({clean(s.detail, REASON_LIMIT)})", style="dim")
        parts.append(row)
    if report.scratch is not None and not report.scratch.ok:
        parts.append(render_verification(report.scratch))
    if report.verification is not None:
        parts.append(render_verification(report.verification))
    for k in report.kept:
        if k.outcome == "not kept":
            parts.append(Text(f"  not kept for a later undo: {clean(k.name, 80)} "
                              f"{clean(k.version or '', 40)} "
                              f"({clean(k.detail, REASON_LIMIT)})", style="yellow"))
    parts.append(Text(_verdict(report), style="bold" if report.ok else "bold red"))
    return Group(*parts)


def markdown(report: UndoReport, show_all: bool = False) -> str:
    out = [f"## envguard undo: `{md(report.environment)}` to revision {report.target}", ""]
    out += [f"- {md(s.name)} {md(s.version or '')}: {md(s.source)} {md(s.detail)}"
            for s in report.sources]
    proof = report.verification or report.scratch
    if proof is not None:
        out += [f"- not reproduced: {md(u.detail)}" for u in proof.unreproduced]
    return "\n".join([*out, "", f"**{md(_verdict(report))}**", ""])


def json(report: UndoReport, show_all: bool = False) -> str:
    from envguard.render import json_text

    return json_text(report.to_dict())
