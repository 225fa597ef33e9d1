"""``envguard history`` report: text, Markdown, JSON; pure functions of the timeline."""

from __future__ import annotations

from datetime import datetime, timezone

from rich.console import Group, RenderableType
from rich.text import Text

from envguard.history import Timeline, summarize, utc
from envguard.render.markdown import md
from envguard.render.sanitize import clean


def _stamps(timeline: Timeline) -> list[str]:
    """Each episode's start, to the minute; to the second when two episodes in a row share
    a minute (an install, a run and a downgrade seconds apart)."""
    minutes = [utc(ep.start) for ep in timeline.episodes]
    if len(set(minutes)) == len(minutes):
        return minutes
    return [datetime.fromtimestamp(ep.start, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
            for ep in timeline.episodes]


def text(timeline: Timeline, show_all: bool = False) -> RenderableType:
    head = Text()
    head.append(clean(timeline.environment), style="bold")
    if timeline.created_at is not None:
        head.append(f", created {utc(timeline.created_at)}")
    parts: list[RenderableType] = [head, Text("")]
    if not timeline.episodes:
        parts.append(Text("no events in this period"))
    for episode, stamp in zip(timeline.episodes, _stamps(timeline), strict=True):
        line = Text()
        line.append(f"{stamp}  ", style="bold")
        line.append(clean(summarize(episode), 2000),
                    style="cyan" if episode.run is not None else "")
        parts.append(line)
    parts += [Text(""), Text("not visible from the disk:", style="dim")]
    parts += [Text(f"- {clean(b, 300)}", style="dim") for b in timeline.blind_spots]
    return Group(*parts)


def markdown(timeline: Timeline, show_all: bool = False) -> str:
    out = [f"## envguard history: {md(timeline.environment)}", "",
           "| when (UTC) | what happened |", "|---|---|"]
    out += [f"| {stamp} | {md(summarize(ep), 2000)} |"
            for ep, stamp in zip(timeline.episodes, _stamps(timeline), strict=True)]
    out += ["", "Not visible from the disk:", ""]
    out += [f"- {md(b, 300)}" for b in timeline.blind_spots]
    return "\n".join(out) + "\n"


def json(timeline: Timeline, show_all: bool = False) -> str:
    from envguard.render import json_text

    return json_text(timeline.to_dict())
