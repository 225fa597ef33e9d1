"""Recorded runs on the timeline, and the versions their snapshots say changed.

``envguard run`` keeps, for each run, the snapshot its gate verified
(:mod:`envguard.runs.store`). Two runs of the same environment bracket whatever happened
between them: the earlier snapshot holds the exact versions and builds before, the later
one (or the environment now) those after. :func:`read_runs` reads the runs of one
environment (a run whose snapshot is of another environment is left out); :func:`annotate`
names the direction of each install between two of them (installed, upgraded, downgraded,
reinstalled) and adds what left no time on disk (a removal) as a :data:`RECORDED` event
between the two runs.

Reading is bounded: the snapshots of the newest :data:`MAX_SNAPSHOTS` distinct digests
(identical environments share one); older runs are shown as runs but not compared.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

from packaging.version import InvalidVersion, Version

from envguard.frozen import frozen
from envguard.history import (
    CHANGED,
    CONDA_INSTALLED,
    DOWNGRADED,
    INSTALLED,
    NEW,
    REBUILT,
    RECORDED,
    REINSTALLED,
    REMOVED,
    REVISION,
    RUN,
    UPGRADED,
    Event,
    parse_iso,
)
from envguard.model import Snapshot

MAX_SNAPSHOTS = 32
"""Distinct stored snapshots read for one timeline, newest runs first."""


@frozen
class Held:
    """What a snapshot says of one package: enough to tell a rebuild from no change."""

    version: str
    build: str


@frozen
class Packages:
    """What one snapshot says of its environment's packages, and nothing else of it."""

    prefix: str
    pip: dict[str, Held]
    conda: dict[str, Held]


@frozen
class Seen:
    """One run of this environment and the packages of the snapshot its gate verified."""

    at: float
    """When it started (its snapshot was taken just before)."""
    run: str
    """How a span names it: ``run <id>``, ``revision 3``, ``the state before revision 3``."""
    packages: Packages


@frozen
class Runs:
    events: tuple[Event, ...]
    """Every run of this environment (and those whose snapshot was not read), as events."""
    seen: tuple[Seen, ...]
    """The runs whose snapshot was read, oldest first."""
    notes: tuple[str, ...] = ()


def packages_of(snapshot: Snapshot) -> Packages:
    pip: dict[str, Held] = {}
    for dist in snapshot.packages:
        pip.setdefault(dist.name, Held(version=dist.version or "?",
                                       build=dist.fingerprint or ""))
    conda = {p.name: Held(version=p.version, build=f"{p.build} {p.sha256 or p.fingerprint or ''}")
             for p in snapshot.conda}
    return Packages(prefix=snapshot.interpreter.prefix, pip=pip, conda=conda)


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""


def _rows(data: dict[str, Any], key: str) -> list[dict[str, Any]]:
    rows = data.get(key)
    return [r for r in rows if isinstance(r, dict) and _text(r.get("name"))] \
        if isinstance(rows, list) else []


def _stored(text: str) -> Packages | None:
    """A stored snapshot's packages, read from its JSON alone (the whole snapshot's model,
    checked and masked, costs several times more and is not needed for names and
    versions); None when it is not a snapshot."""
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        return None
    if not isinstance(data, dict) or not _text(data.get("schema")).startswith(
            "envguard.snapshot/"):
        return None
    interpreter = data.get("interpreter")
    prefix = _text(interpreter.get("prefix")) if isinstance(interpreter, dict) else ""
    pip: dict[str, Held] = {}
    for row in _rows(data, "packages"):
        pip.setdefault(row["name"], Held(version=_text(row.get("version")) or "?",
                                         build=_text(row.get("fingerprint"))))
    conda = {row["name"]: Held(version=_text(row.get("version")), build=(
        f"{_text(row.get('build'))} {_text(row.get('sha256')) or _text(row.get('fingerprint'))}"))
             for row in _rows(data, "conda")}
    return Packages(prefix=prefix, pip=pip, conda=conda) if prefix else None


def read_runs(cwd: Path, prefix: Path) -> Runs:
    """The runs recorded under ``cwd`` of the environment at ``prefix``."""
    from envguard.errors import EnvguardError
    from envguard.runs.store import list_runs, snapshot_path
    from envguard.snapshot_file import read_document

    try:
        records = list_runs(cwd)  # newest first
    except (EnvguardError, OSError):
        return Runs(events=(), seen=())
    read: dict[str, Packages | None] = {}
    here = os.path.realpath(prefix)
    events, seen, others, unread = [], [], 0, 0
    for record in records:
        at = parse_iso(record.started_at)
        if at is None:
            continue
        if record.snapshot not in read and len(read) < MAX_SNAPSHOTS:
            try:
                read[record.snapshot] = _stored(read_document(
                    snapshot_path(cwd, record.snapshot), follow=False))
            except (EnvguardError, OSError):
                read[record.snapshot] = None
        packages = read.get(record.snapshot)
        if packages is not None and os.path.realpath(packages.prefix) != here:
            others += 1
            continue
        if packages is None:
            unread += 1
        else:
            seen.append(Seen(at=at, run=f"run {record.id}", packages=packages))
        events.append(Event(at=at, kind=RUN, subject=record.id,
                            detail=_run_detail(record.outcome, record.gate),
                            evidence=".envguard/runs", ended_at=parse_iso(record.ended_at)))
    notes = []
    if others:
        notes.append(f"{others} recorded run(s) under {cwd} are of another environment and "
                     "left out")
    if unread:
        notes.append(f"{unread} recorded run(s) not compared: their snapshot was not read "
                     f"(only the newest {MAX_SNAPSHOTS} are, or it is missing)")
    return Runs(events=tuple(events), seen=tuple(sorted(seen, key=lambda s: s.at)),
                notes=tuple(notes))


def direction(old: str, new: str) -> str:
    """:data:`UPGRADED` or :data:`DOWNGRADED`; :data:`CHANGED` when either version is not
    one that can be ordered."""
    try:
        return UPGRADED if Version(new) > Version(old) else DOWNGRADED
    except InvalidVersion:
        return CHANGED


def _change(before: Held | None, after: Held | None) -> tuple[str, str | None]:
    """(direction, the version replaced)."""
    if before is None:
        return NEW, None
    if after is None:
        return REMOVED, before.version
    if before.version == after.version:
        return REBUILT, (before.version if before.build != after.build else None)
    return direction(before.version, after.version), before.version


@frozen
class _Window:
    start: float
    end: float
    """The later run's start, or when the environment was read (a file time after that,
    a clock's skew, still belongs to the last window)."""
    last: bool
    span: str
    """``recorded snapshots of run A and run B`` (or ``... and the environment now``)."""
    before: dict[str, Held]
    after: dict[str, Held]
    kinds: tuple[str, ...]
    """The disk's events these packages are matched with."""


def _windows(seen: tuple[Seen, ...], now: Packages, taken_at: float,
             conda_history: bool) -> Iterable[_Window]:
    if not seen:
        return
    ends = [*((s.at, s.run, s.packages) for s in seen[1:]), (taken_at, None, now)]
    for earlier, (end, run, later) in zip(seen, ends, strict=True):
        if end <= earlier.at:
            continue
        span = f"recorded snapshots of {earlier.run} and {run or 'the environment now'}"
        yield _Window(start=earlier.at, end=end, last=run is None, span=span,
                      before=earlier.packages.pip, after=later.pip,
                      kinds=(INSTALLED, REINSTALLED))
        if not conda_history:  # conda's own history names its changes, with their times
            yield _Window(start=earlier.at, end=end, last=run is None, span=span,
                          before=earlier.packages.conda, after=later.conda,
                          kinds=(CONDA_INSTALLED,))


_INSTALLER = re.compile(r"^\S+ \(([^()]*)\)$")


def _named(event: Event, change: str, old: str | None, after: Held, span: str) -> Event:
    """``event`` named with its direction: ``1.0 (uv); downgraded from 2.0, per the
    recorded snapshots of run A and run B`` (or of a revision's before and after)."""
    said = {NEW: "not in the earlier snapshot", REBUILT: (
        "same version, other build" if old is not None else "same version and build")}
    installer = _INSTALLER.match(event.detail)
    detail = (after.version + (f" ({installer.group(1)})" if installer else "")
              + f"; {change}" + (f" from {old}" if old and old != after.version else "")
              + (f" ({said[change]})" if change in said else "") + f", per the {span}")
    kind = REINSTALLED if change == REBUILT and event.kind == INSTALLED else event.kind
    return replace(event, kind=kind, change=change, old=old, version=after.version,
                   detail=detail)


def annotate(events: list[Event], runs: Runs, now: Snapshot, taken_at: float,
             conda_history: bool) -> list[Event]:
    """``events`` with each package event between two recorded runs named with its
    direction and the version it replaced, plus a :data:`RECORDED` event for each change
    the snapshots show that no event on disk holds (a removal, an install whose time was
    lost)."""
    out = list(events)
    for window in _windows(runs.seen, packages_of(now), taken_at, conda_history):
        matched: set[str] = set()
        for i, event in enumerate(out):
            if event.kind in window.kinds and window.start < event.at \
                    and (event.at <= window.end or window.last):
                before, after = window.before.get(event.subject), window.after.get(
                    event.subject)
                if after is None:
                    continue  # an event of another window's package of the same name
                change, old = _change(before, after)
                out[i] = _named(event, change, old, after, window.span)
                matched.add(event.subject)
        for name in sorted(window.before.keys() | window.after.keys()):
            before, after = window.before.get(name), window.after.get(name)
            if name in matched or before == after:
                continue
            change, old = _change(before, after)
            conda = window.kinds == (CONDA_INSTALLED,)
            out.append(Event(
                at=window.end, kind=RECORDED, subject=name, change=change, old=old,
                version=after.version if after else None, not_before=window.start,
                detail=("conda package, " if conda else "") + f"{change}, per the "
                       f"{window.span}; the disk keeps no time for it",
                evidence=window.span))
    return out


def _run_detail(outcome: str, gate: str) -> str:
    """``exit 0, gate passed``; a refused run is ``refused by the gate``, said once."""
    return "refused by the gate" if outcome == "refused" else f"{outcome}, gate {gate}"


def read_revisions(prefix: Path) -> Runs:
    """The changes ``envguard install``, ``undo`` and ``restore --in-place`` recorded for the
    environment at ``prefix`` (:mod:`envguard.revisions.store`): each an event, and its
    before and after snapshots as two points that bracket the installs it made, so those
    are named with the exact versions they replaced."""
    from envguard.errors import EnvguardError
    from envguard.revisions.store import env_folder, list_revisions
    from envguard.snapshot_file import read_document

    try:
        revisions = list_revisions(str(prefix)).revisions
    except (EnvguardError, OSError):
        return Runs(events=(), seen=())
    folder = env_folder(prefix) / "snapshots"
    read: dict[str, Packages | None] = {}

    def packages(digest: str) -> Packages | None:
        if digest not in read and len(read) < MAX_SNAPSHOTS:
            try:
                read[digest] = _stored(read_document(folder / f"{digest}.json", follow=False))
            except (EnvguardError, OSError):
                read[digest] = None
        return read.get(digest)

    events, seen = [], []
    for rev in revisions[-MAX_SNAPSHOTS // 2:]:
        start, end = parse_iso(rev.started_at), parse_iso(rev.ended_at)
        if start is None or end is None:
            continue
        before, after = packages(rev.before), packages(rev.after)
        if before is not None and after is not None:
            seen.append(Seen(at=start - 1e-3, run=f"the state before revision {rev.number}",
                             packages=before))
            seen.append(Seen(at=end, run=f"revision {rev.number}", packages=after))
        outcome = "" if rev.exit_code in (0, None) else f"; exit {rev.exit_code}"
        events.append(Event(at=start, kind=REVISION, subject=f"revision {rev.number}",
                            detail=f"envguard {rev.kind}: {' '.join(rev.argv)}{outcome}",
                            evidence="envguard revisions", ended_at=end))
    return Runs(events=tuple(events), seen=tuple(seen))


def merged(runs: Runs, revisions: Runs) -> Runs:
    """Runs and revisions on one timeline: their points in time order."""
    return Runs(events=(*runs.events, *revisions.events),
                seen=tuple(sorted((*runs.seen, *revisions.seen), key=lambda s: s.at)),
                notes=(*runs.notes, *revisions.notes))
