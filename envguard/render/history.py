"""``envguard history`` report: text, Markdown, JSON; pure functions of the timeline."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.text import Text

from envguard.history import Timeline, summarize, utc
from envguard.render.markdown import md
from envguard.render.sanitize import clean


def text(timeline: Timeline, show_all: bool = False) -> RenderableType:
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


def markdown(timeline: Timeline, show_all: bool = False) -> str:
    out = [f"## envguard history: {md(timeline.environment)}", "",
           "| when (UTC) | what happened |", "|---|---|"]
    out += [f"| {utc(ep.start)} | {md(summarize(ep), 2000)} |" for ep in timeline.episodes]
    out += ["", "Not visible from the disk:", ""]
    out += [f"- {md(b, 300)}" for b in timeline.blind_spots]
    return "\n".join(out) + "\n"


def json(timeline: Timeline, show_all: bool = False) -> str:
    from envguard.render import json_text

    return json_text(timeline.to_dict())
