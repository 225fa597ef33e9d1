"""``envguard doctor`` report: text, Markdown, JSON; pure functions of the report (the
finding views are the diff's)."""

from __future__ import annotations

from typing import Any

from rich.console import Group, RenderableType
from rich.text import Text

from envguard.doctor import DoctorReport
from envguard.render.diff import finding_dict, finding_lines, finding_view
from envguard.render.markdown import md
from envguard.render.sanitize import clean

DOCTOR_SCHEMA = "envguard.doctor/1"


def text(report: DoctorReport, show_all: bool = False) -> RenderableType:
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


def markdown(report: DoctorReport, show_all: bool = False) -> str:
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


def json(report: DoctorReport, show_all: bool = False) -> str:
    from envguard.render import json_text

    return json_text(doctor_dict(report))
