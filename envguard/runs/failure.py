"""What changed since the last successful run, for a guarded run that just failed: as data.

``envguard run`` shows it on stderr after the child's output; the full report is
``envguard diff @last-good:LOCK @run:1``.
"""

from __future__ import annotations

import json
from pathlib import Path

from envguard.changes import ADDED, REMOVED, Change, diff
from envguard.errors import InputError
from envguard.explain import explain
from envguard.frozen import frozen
from envguard.model import Snapshot
from envguard.runs.store import RunRecord, last_good, last_good_of, snapshot_path
from envguard.snapshot_file import read_snapshot

MAX_LINES = 5
_VALUE_CHARS = 60


@frozen
class FailureNote:
    last_good: RunRecord | None
    """None: no successful run recorded yet (or its snapshot is unreadable)."""
    lines: tuple[str, ...]
    """At most :data:`MAX_LINES`: findings first (``[rule] title``), then material changes
    no finding covers (``section.key: old -> new``)."""
    more: int
    """Findings and changes left out of ``lines``."""
    problem: str | None = None
    """Why the last good snapshot could not be compared, when it could not."""

    @property
    def identical(self) -> bool:
        return self.last_good is not None and self.problem is None and not self.lines


def _short(value: object) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= _VALUE_CHARS else text[:_VALUE_CHARS - 3] + "..."


def change_line(change: Change) -> str:
    if change.kind == ADDED:
        return f"{change.path}: added ({_short(change.new)})"
    if change.kind == REMOVED:
        return f"{change.path}: removed (was {_short(change.old)})"
    return f"{change.path}: {_short(change.old)} -> {_short(change.new)}"


def explain_failure(cwd: Path, snapshot: Snapshot, symptom: str | None = None,
                    lock: str | None = None) -> FailureNote:
    """``diff(last-good, snapshot)``, cut to the few lines a failed run shows, ranked by
    ``symptom`` (the run's own last stderr lines: the error it failed with). With ``lock``,
    the last good run of that lock (``@last-good:LOCK``): another lock's environment is not
    the one this run needed."""
    good = last_good(cwd) if lock is None else last_good_of(cwd, lock)
    if good is None:
        return FailureNote(last_good=None, lines=(), more=0)
    try:
        old = read_snapshot(snapshot_path(cwd, good.snapshot), follow=False)
    except InputError as exc:
        return FailureNote(last_good=good, lines=(), more=0, problem=str(exc))
    changes = diff(old, snapshot)
    if changes.equivalent:
        return FailureNote(last_good=good, lines=(), more=0)
    findings = explain(old, snapshot, changes, symptom or None)
    covered = {(c.section, c.key) for f in findings for c in f.changes}
    lines = [f"[{f.rule}] {f.title}" for f in findings]
    lines += [change_line(c) for c in changes.material if (c.section, c.key) not in covered]
    return FailureNote(last_good=good, lines=tuple(lines[:MAX_LINES]),
                       more=max(0, len(lines) - MAX_LINES))
