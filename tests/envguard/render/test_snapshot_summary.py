"""The snapshot's stderr summary (a pure function of the snapshot): its integrity line says
when edited files are shared by hard link (docs/SNAPSHOT.md)."""

from __future__ import annotations

import dataclasses

from rich.console import Console

from envguard.model import IntegrityIssue, Snapshot
from envguard.render.snapshot import snapshot_summary
from tests.paths import DATA


def _summary(*issues: IntegrityIssue) -> str:
    snap = Snapshot.from_json((DATA / "h200-snapshot.json").read_text())
    snap = dataclasses.replace(snap, integrity=dataclasses.replace(
        snap.integrity, mode="size", issues=list(issues)))
    console = Console(width=400, record=True, color_system=None)
    console.print(snapshot_summary(snap, None))
    return console.export_text()


def _edited(path: str, links: int | None = None, shared_with: str | None = None
            ) -> IntegrityIssue:
    return IntegrityIssue(package="torch", path=path, problem="size", expected="23",
                          actual="27", links=links, shared_with=shared_with)


def test_shared_edits_are_counted_in_the_integrity_line() -> None:
    text = _summary(_edited("torch/a.py", 3, "/c/uv/archive-v0/X"), _edited("torch/b.py", 2),
                    _edited("torch/c.py"))
    assert "3 differ from RECORD in torch (1 shared with uv's cache by hard link, 1 " \
           "hard-linked elsewhere)" in text


def test_edits_of_one_link_are_not_called_shared() -> None:
    text = _summary(_edited("torch/a.py"))
    assert "1 differ from RECORD in torch" in text and "hard link" not in text
