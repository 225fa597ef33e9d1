"""``envguard bisect`` output: text for a terminal, Markdown and JSON (the report's ``to_dict``);
pure functions of the report.

Package names, versions, variable values and the command's output come from snapshots and
from the command: they go into ``Text`` objects after ``clean()`` (masked), never markup.
"""

from __future__ import annotations

import shlex

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from envguard.bisection.report import FOUND, PLANNED, REFUSED, BisectReport
from envguard.bisection.trial import Trial
from envguard.redact import redact_argv, redact_text
from envguard.render.sanitize import clean

_STYLE = {"pass": "green", "fail": "bold red", "skip": "yellow"}
_VERDICT = {FOUND: ("culprit found", "bold green"), REFUSED: ("refused", "bold red"),
            PLANNED: ("planned (--dry-run: nothing built)", "bold")}


def _safe(text: str, limit: int = 400) -> str:
    return clean(redact_text(text), limit)


def _command(report: BisectReport) -> str:
    return shlex.join(redact_argv(list(report.command)))


def _applied(trial: Trial, total: int) -> str:
    if not trial.applied:
        return "GOOD (none)"
    if len(trial.applied) == total:
        return f"BAD (all {total})"
    shown = ", ".join(trial.applied[:4])
    more = f" +{len(trial.applied) - 4}" if len(trial.applied) > 4 else ""
    return f"{len(trial.applied)}: {shown}{more}"


def _runs(trial: Trial) -> str:
    if not trial.runs:
        return "–"
    if len(trial.runs) == 1:
        return f"{trial.runs[0].seconds:.1f} s"
    return f"{trial.failed_runs}/{len(trial.runs)} failed, {trial.run_seconds:.1f} s"


def text(report: BisectReport, show_all: bool = False) -> RenderableType:
    head = Text()
    head.append(f"bisect {_safe(report.good_name, 200)} → {_safe(report.bad_name, 200)}: ",
                style="bold")
    label, style = _VERDICT.get(report.verdict, ("inconclusive", "bold yellow"))
    head.append(label, style=style)
    if report.verdict != PLANNED:
        head.append(f"  ({len(report.steps)} change(s), {len(report.trials)} trial(s), "
                    f"{report.seconds:.1f} s)", style="dim")
    parts: list[RenderableType] = [head]
    if report.command:
        parts.append(Text(f"command: {_safe(_command(report))}", style="dim"))
    if report.verdict != REFUSED:
        parts.append(Text(_safe(report.summary, 800), style="bold"))
    if report.reason:
        parts.append(Text(("" if report.verdict == REFUSED else "but: ")
                          + _safe(report.reason, 800), style="red" if report.verdict == REFUSED
                          else "yellow"))
    for culprit in report.culprits:
        line = Text("  • ")
        line.append(_safe(culprit.step.label), style="bold")
        for link in culprit.links[:3]:
            line.append(f"\n      [{link.rule}] ", style="dim")
            line.append(_safe(link.title, 300))
            if link.remedy:
                line.append(f"\n        remedy: {_safe(link.remedy[0], 300)}", style="dim")
        parts.append(line)
    if report.verdict == PLANNED:
        parts += [Text(f"  {_safe(s.label)}") for s in report.steps]
    table = Table(show_edge=False, pad_edge=False, title="trials", title_justify="left")
    for col in ("#", "applied", "outcome", "build", "runs", "note"):
        table.add_column(col, overflow="fold")
    for t in report.trials:
        note = t.reason or ("mixed outcomes" if t.mixed else "")
        table.add_row(str(t.number), _safe(_applied(t, len(report.steps)), 120),
                      Text(t.outcome + (" (mixed)" if t.mixed else ""),
                           style=_STYLE.get(t.outcome, "")),
                      f"{t.build_seconds:.1f} s", _runs(t), _safe(note, 300))
    if report.trials:
        parts.append(table)
    failing = [t for t in report.trials if t.outcome == "fail" and t.tail]
    last = next((t for t in reversed(failing) if set(t.applied) == {
        c.step.id for c in report.culprits}), failing[-1] if failing else None)
    if report.verdict == REFUSED:
        last = next((t for t in report.trials if t.tail), None)
    if last is not None:
        parts.append(Text(f"output of trial {last.number} (last lines):", style="bold"))
        parts.append(Text("\n".join("    " + _safe(x, 300) for x in last.tail[-10:]),
                          style="dim"))
    parts += [Text("note: " + _safe(n), style="yellow") for n in report.notes]
    parts += [Text(f"build: {_safe(b.name)} {_safe(b.version)} from {b.source}: "
                   f"{_safe(b.where, 300)}", style="dim") for b in report.builds]
    if report.workdir:
        parts.append(Text(f"trial venvs kept in {_safe(report.workdir)}", style="dim"))
    return Group(*parts)


def _md(value: str, limit: int = 300) -> str:
    return _safe(value, limit).replace("|", "\\|").replace("`", "'")


def markdown(report: BisectReport, show_all: bool = False) -> str:
    label = _VERDICT.get(report.verdict, ("inconclusive", ""))[0]
    out = [f"## envguard bisect: {label}", "",
           f"`{_md(report.good_name)}` → `{_md(report.bad_name)}`, command "
           f"`{_md(_command(report))}`: {len(report.steps)} change(s), "
           f"{len(report.trials)} trial(s), {report.seconds:.1f} s", ""]
    if report.verdict != REFUSED:
        out += [f"**{_md(report.summary, 800)}**", ""]
    if report.reason:
        out += [f"> {_md(report.reason, 800)}", ""]
    for culprit in report.culprits:
        out.append(f"- **{_md(culprit.step.label)}**")
        out += [f"  - `{link.rule}`: {_md(link.title)}" for link in culprit.links]
    out += ["", "| # | applied | outcome | build | runs | note |", "|---|---|---|---|---|---|"]
    for t in report.trials:
        out.append(f"| {t.number} | {_md(_applied(t, len(report.steps)))} | {t.outcome}"
                   f"{' (mixed)' if t.mixed else ''} | {t.build_seconds:.1f} s | "
                   f"{_md(_runs(t))} | {_md(t.reason)} |")
    out += ["", *(f"- note: {_md(n)}" for n in report.notes)]
    return "\n".join(out).rstrip() + "\n"


def json(report: BisectReport, show_all: bool = False) -> str:
    from envguard.render import json_text

    return json_text(report.to_dict())
