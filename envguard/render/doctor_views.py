"""``envguard doctor`` and ``envguard history`` reports: text, Markdown, JSON; pure
functions of the report (the finding views are the diff's)."""

from __future__ import annotations

import json
from typing import Any

from rich.console import Group, RenderableType
from rich.text import Text

from envguard.doctor import DoctorReport
from envguard.history import Timeline, summarize, utc
from envguard.render.diff_json import finding_dict
from envguard.render.diff_markdown import finding_lines, md
from envguard.render.diff_text import finding_view
from envguard.render.sanitize import clean

DOCTOR_SCHEMA = "envguard.doctor/1"


def doctor_text(report: DoctorReport) -> RenderableType:
    head = Text()
    head.append(f"{clean(report.environment or report.snapshot.interpreter.prefix)}: ",
                style="bold")
    head.append(clean(report.verdict, 600),
                style="bold green" if report.healthy else "bold red")
    parts: list[RenderableType] = [head, Text("")]
    if report.symptom:
        parts.insert(1, Text(f"symptom: {clean(report.symptom, 300)}", style="dim"))
    parts += [finding_view(f) for f in report.findings]
    return Group(*parts)


def doctor_markdown(report: DoctorReport) -> str:
    out = [f"## envguard doctor: {md(report.environment or report.snapshot.interpreter.prefix)}",
           "", f"**{md(report.verdict, 500)}**", ""]
    if report.symptom:
        out += [f"Symptom: `{clean(report.symptom, 200).replace('`', chr(39))}`", ""]
    for f in report.findings:
        out += finding_lines(f)
    return "\n".join(out)


def doctor_dict(report: DoctorReport) -> dict[str, Any]:
    return {"schema": DOCTOR_SCHEMA, "environment": report.environment,
            "interpreter": report.snapshot.interpreter.executable,
            "healthy": report.healthy, "verdict": report.verdict, "symptom": report.symptom,
            "findings": [finding_dict(f) for f in report.findings]}


def doctor_json(report: DoctorReport) -> str:
    return json.dumps(doctor_dict(report), indent=2, sort_keys=True, ensure_ascii=True) + "\n"


def history_text(timeline: Timeline) -> RenderableType:
    head = Text()
    head.append(clean(timeline.environment), style="bold")
    if timeline.created_at is not None:
        head.append(f", created {utc(timeline.created_at)}")
    parts: list[RenderableType] = [head, Text("")]
    if not timeline.episodes:
        parts.append(Text("no events in this period"))
    for episode in timeline.episodes:
        line = Text()
        line.append(f"{utc(episode.start)}  ", style="bold")
        line.append(clean(summarize(episode), 2000))
        parts.append(line)
    parts += [Text(""), Text("not visible from the disk:", style="dim")]
    parts += [Text(f"- {clean(b, 300)}", style="dim") for b in timeline.blind_spots]
    return Group(*parts)


def history_markdown(timeline: Timeline) -> str:
    out = [f"## envguard history: {md(timeline.environment)}", "",
           "| when (UTC) | what happened |", "|---|---|"]
    out += [f"| {utc(ep.start)} | {md(summarize(ep), 2000)} |" for ep in timeline.episodes]
    out += ["", "Not visible from the disk:", ""]
    out += [f"- {md(b, 300)}" for b in timeline.blind_spots]
    return "\n".join(out) + "\n"


def history_json(timeline: Timeline) -> str:
    return json.dumps(timeline.to_dict(), indent=2, sort_keys=True, ensure_ascii=True) + "\n"
