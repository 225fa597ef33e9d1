"""The history report's three renderers: pure functions of a timeline."""

from __future__ import annotations

import json
from datetime import datetime, timezone

from rich.console import Console

from envguard.history import CREATED, DOWNGRADED, INSTALLED, RUN, Event, Timeline, group
from envguard.render import history

T0 = datetime(2026, 12, 4, 14, 2, 5, tzinfo=timezone.utc).timestamp()


def timeline(*events: Event) -> Timeline:
    return Timeline(environment="/venv", created_at=None, taken_at=T0 + 3600, events=events,
                    episodes=group(events))


def plain(tl: Timeline) -> str:
    console = Console(width=200, record=True, color_system=None)
    console.print(history.text(tl))
    return console.export_text()


SPLIT = timeline(
    Event(at=T0, kind=INSTALLED, subject="helperlib", version="2.0", detail="2.0 (uv)"),
    Event(at=T0 + 5, kind=RUN, subject="r1", detail="exit 0, gate passed", ended_at=T0 + 6),
    Event(at=T0 + 10, kind=INSTALLED, subject="helperlib", version="1.0", old="2.0",
          change=DOWNGRADED))


def test_episodes_seconds_apart_are_told_apart_to_the_second() -> None:
    text = plain(SPLIT)
    assert "2026-12-04 14:02:05 UTC  installed: helperlib 2.0" in text
    assert "2026-12-04 14:02:10 UTC  run: r1 (exit 0, gate passed)" in text
    assert "2026-12-04 14:02:15 UTC  downgraded: helperlib 2.0 → 1.0" in text
    markdown = history.markdown(SPLIT)
    assert "| 2026-12-04 14:02:15 UTC | downgraded: helperlib 2.0 → 1.0 |" in markdown
    doc = json.loads(history.json(SPLIT))
    assert [ep["run"] for ep in doc["episodes"]] == [None, "r1", None]
    assert doc["events"][2] == {
        "at": T0 + 10, "kind": "installed", "subject": "helperlib", "detail": "",
        "evidence": "", "change": "downgraded", "version": "1.0", "old": "2.0",
        "ended_at": None, "not_before": None}


def test_episodes_minutes_apart_keep_the_minute() -> None:
    apart = timeline(Event(at=T0 - 1, kind=CREATED, subject="/venv"),
                     Event(at=T0, kind=INSTALLED, subject="a", version="1"),
                     Event(at=T0 + 600, kind=INSTALLED, subject="b", version="2"))
    text = plain(apart)
    assert "2026-12-04 14:02 UTC  environment created; installed: a 1\n" in text
    assert "2026-12-04 14:12 UTC  installed: b 2 (whether it replaced earlier versions is " \
           "not on disk)" in text
    assert "14:02:05" not in text and "14:02:05" not in history.markdown(apart)
