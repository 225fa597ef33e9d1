"""Read an environment's events from the disk: :func:`read_timeline`.

Every time comes from a file's modification time, read with one ``stat``: a
distribution's ``RECORD`` (written last by pip and uv, after the files), a modified
file, a compile cache's entries, ``pyvenv.cfg``; plus ``conda-meta/history`` (or, when
it is empty, the times of ``conda-meta/*.json``: :mod:`.conda`) and envguard's run records,
which carry their own times and the snapshots that name the versions replaced
(:mod:`.recorded`).
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from pathlib import Path

from envguard.history import (
    BLIND_SPOTS,
    CACHE_CREATED,
    CACHE_WRITTEN,
    CREATED,
    FILE_MODIFIED,
    GAP_S,
    INSTALLED,
    REINSTALLED,
    REPLACED,
    Event,
    Timeline,
    group,
)
from envguard.history.conda import (
    MAX_CONDA_HISTORY_BYTES,
    conda_history,
    created,
    record_events,
)
from envguard.history.recorded import annotate, merged, read_revisions, read_runs
from envguard.model import Distribution, Snapshot
from envguard.names import normalize_name

__all__ = ["MAX_CONDA_HISTORY_BYTES", "conda_history", "created_at", "read_timeline"]

_CHANGED = frozenset({"size", "hash", "modified-after-install"})
_REQ_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


def _mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except OSError:
        return None


def _install_time(dist: Distribution) -> tuple[float, str] | None:
    folder = Path(dist.location) / dist.metadata_dir  # an absolute metadata_dir wins
    for name in ("RECORD", "INSTALLER", "METADATA", "PKG-INFO"):
        at = _mtime(folder / name)
        if at is not None:
            return at, f"{folder.name}/{name}"
    at = _mtime(folder)
    return (at, folder.name) if at is not None else None


def created_at(prefix: Path, conda: list[Event] | None = None,
               records: list[Event] | None = None) -> tuple[float, str] | None:
    """When the environment was made: ``pyvenv.cfg``, else what the conda prefix says
    (:func:`envguard.history.conda.created`; ``conda``: its history's events, when already
    read, ``records``: its records' when the history is empty)."""
    at = _mtime(prefix / "pyvenv.cfg")
    if at is not None:
        return at, "pyvenv.cfg"
    return created(prefix, conda_history(prefix) if conda is None else conda, records or [])


def _requirers(snapshot: Snapshot) -> dict[str, list[str]]:
    """name -> the installed distributions whose Requires-Dist names it (markers ignored:
    the question is only whether an installer put them in after it)."""
    out: dict[str, list[str]] = {}
    for dist in snapshot.packages:
        for req in dist.requires:
            if "extra ==" in req or "extra==" in req:
                continue
            found = _REQ_NAME.match(req)
            if found:
                out.setdefault(normalize_name(found.group(1)), []).append(dist.name)
    return out


def _installs(snapshot: Snapshot, created: float | None) -> Iterator[Event]:
    """Each distribution at its ``.dist-info`` time. Which version it replaced the disk does
    not say (:mod:`.recorded` names it between recorded runs); one installed after packages
    that require it, long after the environment was made, was installed again over an
    earlier install (:data:`REPLACED`)."""
    times: dict[str, tuple[float, str]] = {}
    for dist in snapshot.packages:
        found = _install_time(dist)
        if found is not None:
            times[dist.name] = found
    requirers = _requirers(snapshot)
    for dist in snapshot.packages:
        if dist.name not in times:
            continue
        at, evidence = times[dist.name]
        earlier = sorted(r for r in requirers.get(dist.name, ())
                         if r in times and times[r][0] < at - GAP_S)
        if earlier and (created is None or at > created + GAP_S):
            names = ", ".join(earlier[:3]) + (" ..." if len(earlier) > 3 else "")
            yield Event(at=at, kind=REINSTALLED, subject=dist.name, evidence=evidence,
                        change=REPLACED, version=dist.version,
                        detail=f"{dist.version} installed again, after {len(earlier)} "
                               f"package(s) that require it ({names}): a reinstall or a "
                               "replacement; the version it replaced is not on disk")
        else:
            yield Event(at=at, kind=INSTALLED, subject=dist.name, version=dist.version,
                        detail=f"{dist.version or '?'} "
                               f"({dist.installer or 'unknown installer'})",
                        evidence=evidence)


def _modified_files(snapshot: Snapshot) -> Iterator[Event]:
    locations = {d.name: d.location for d in snapshot.packages}
    for issue in snapshot.integrity.issues:
        if issue.problem not in _CHANGED or issue.package not in locations:
            continue
        path = Path(locations[issue.package]) / issue.path
        at = _mtime(path)
        if at is not None:
            yield Event(at=at, kind=FILE_MODIFIED, subject=issue.path,
                        detail=f"{issue.package}, {issue.problem}", evidence=str(path))


def _caches(snapshot: Snapshot) -> Iterator[Event]:
    for cache in snapshot.caches:
        if not cache.exists:
            continue
        folder = Path(cache.path)
        try:
            with os.scandir(folder) as entries:
                times = [e.stat(follow_symlinks=False).st_mtime for e in entries]
        except OSError:
            continue
        oldest = min(times) if times else _mtime(folder)
        if oldest is None:
            continue
        state = f"{cache.files} files now" if cache.files else "empty now"
        yield Event(at=oldest, kind=CACHE_CREATED, subject=f"{cache.kind} {cache.path}",
                    detail=f"oldest entry; {state}", evidence=str(folder))
        if cache.newest_mtime and cache.newest_mtime - oldest > GAP_S:
            yield Event(at=cache.newest_mtime, kind=CACHE_WRITTEN,
                        subject=f"{cache.kind} {cache.path}", detail="newest entry",
                        evidence=str(folder))


def read_timeline(snapshot: Snapshot, *, cwd: Path | None = None,
                  now: float | None = None) -> Timeline:
    """Every event the disk holds for ``snapshot``'s environment (and envguard's runs of it
    recorded under ``cwd``), oldest first, grouped into episodes; each install between two
    recorded runs named with the versions it replaced."""
    prefix = Path(snapshot.interpreter.prefix)
    taken_at = now if now is not None else time.time()
    notes: list[str] = []
    conda = conda_history(prefix, notes)
    records = [] if conda else record_events(snapshot, prefix)
    made = created_at(prefix, conda, records)
    runs = merged(read_runs(cwd or Path.cwd(), prefix), read_revisions(prefix))
    events: list[Event] = []
    if made is not None:
        events.append(Event(at=made[0], kind=CREATED, subject=str(prefix), evidence=made[1]))
    events += _installs(snapshot, made[0] if made else None)
    events += _modified_files(snapshot)
    events += _caches(snapshot)
    events += conda
    events += records
    events += runs.events
    events = annotate(events, runs, snapshot, taken_at, conda_history=bool(conda))
    ordered = tuple(sorted(events, key=lambda e: (e.at, e.kind, e.subject)))
    return Timeline(environment=str(prefix), created_at=made[0] if made else None,
                    taken_at=taken_at, events=ordered, episodes=group(ordered),
                    blind_spots=(*notes, *runs.notes, *BLIND_SPOTS))
