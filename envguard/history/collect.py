"""Read an environment's events from the disk: :func:`read_timeline`.

Every time comes from a file's modification time, read with one ``stat``: a
distribution's ``RECORD`` (written last by pip and uv, after the files), a modified
file, a compile cache's entries, ``pyvenv.cfg``; plus ``conda-meta/history`` and
envguard's run records, which carry their own times.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

from envguard.history import (
    BLIND_SPOTS,
    CACHE_CREATED,
    CACHE_WRITTEN,
    CONDA,
    CREATED,
    FILE_MODIFIED,
    GAP_S,
    INSTALLED,
    REINSTALLED,
    RUN,
    Event,
    Timeline,
    group,
    parse_iso,
)
from envguard.input_file import METADATA_BYTES, NotReadable, read_bounded_text
from envguard.model import Distribution, Snapshot

_CHANGED = frozenset({"size", "hash", "modified-after-install"})
_CONDA_HEADER = re.compile(r"^==> (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) <==$")
_REQ_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")
MAX_CONDA_HISTORY_BYTES = METADATA_BYTES


def _mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except OSError:
        return None


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _install_time(dist: Distribution) -> tuple[float, str] | None:
    folder = Path(dist.location) / dist.metadata_dir  # an absolute metadata_dir wins
    for name in ("RECORD", "INSTALLER", "METADATA", "PKG-INFO"):
        at = _mtime(folder / name)
        if at is not None:
            return at, f"{folder.name}/{name}"
    at = _mtime(folder)
    return (at, folder.name) if at is not None else None


def created_at(prefix: Path, conda: list[Event] | None = None) -> tuple[float, str] | None:
    """When the environment was made: ``pyvenv.cfg``, else conda's first history entry
    (``conda``: :func:`conda_history`'s events, when already read)."""
    at = _mtime(prefix / "pyvenv.cfg")
    if at is not None:
        return at, "pyvenv.cfg"
    first = next(iter(conda_history(prefix) if conda is None else conda), None)
    return (first.at, "conda-meta/history") if first is not None else None


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
                out.setdefault(_normalize(found.group(1)), []).append(dist.name)
    return out


def _installs(snapshot: Snapshot, created: float | None,
              recorded: Snapshot | None) -> Iterator[Event]:
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
        detail = f"{dist.version or '?'} ({dist.installer or 'unknown installer'})"
        earlier = sorted(r for r in requirers.get(dist.name, ())
                         if r in times and times[r][0] < at - GAP_S)
        before = recorded.package(dist.name) if recorded is not None else None
        if before is not None and before.version == dist.version \
                and before.fingerprint != dist.fingerprint and dist.fingerprint:
            yield Event(at=at, kind=REINSTALLED, subject=dist.name, evidence=evidence,
                        detail=f"{dist.version} reinstalled (same version, new build: RECORD "
                               "fingerprint differs from the last successful run's)")
        elif earlier and (created is None or at > created + GAP_S):
            names = ", ".join(earlier[:3]) + (" ..." if len(earlier) > 3 else "")
            yield Event(at=at, kind=REINSTALLED, subject=dist.name, evidence=evidence,
                        detail=f"{dist.version} installed again, after {len(earlier)} "
                               f"package(s) that require it ({names}): a reinstall or a "
                               "replacement")
        else:
            yield Event(at=at, kind=INSTALLED, subject=dist.name, detail=detail,
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


def conda_history(prefix: Path, notes: list[str] | None = None) -> list[Event]:
    """``conda-meta/history``: one event per transaction (``+`` added, ``-`` removed).

    Read bounded (:func:`~envguard.input_file.read_bounded`): a FIFO, a device, a symlink
    loop or a file over :data:`MAX_CONDA_HISTORY_BYTES` gives no events, and a line in
    ``notes`` that says why."""
    path = prefix / "conda-meta" / "history"
    try:
        text = read_bounded_text(path, limit=MAX_CONDA_HISTORY_BYTES, what="conda history")
    except FileNotFoundError:
        return []
    except NotReadable as exc:
        if notes is not None:
            notes.append(f"conda-meta/history not read ({path}): {exc.reason}")
        return []
    events: list[Event] = []
    at: float | None = None
    command = ""
    added: list[str] = []
    removed: list[str] = []

    def flush() -> None:
        if at is not None and (added or removed or command):
            what = [f"+{len(added)}" if added else "", f"-{len(removed)}" if removed else ""]
            names = ", ".join(n.split("::")[-1] for n in [*added, *removed][:4])
            events.append(Event(at=at, kind=CONDA, subject=command or "conda transaction",
                                detail=" ".join(w for w in what if w) + (f": {names}"
                                                                         if names else ""),
                                evidence=str(path)))

    for line in text.splitlines():
        header = _CONDA_HEADER.match(line.strip())
        if header:
            flush()
            stamp = datetime.strptime(header.group(1), "%Y-%m-%d %H:%M:%S")
            at, command, added, removed = stamp.timestamp(), "", [], []
        elif line.startswith("# cmd:"):
            command = line[len("# cmd:"):].strip()
        elif line.startswith("+"):
            added.append(line[1:].strip())
        elif line.startswith("-"):
            removed.append(line[1:].strip())
    flush()
    return events


def _runs(cwd: Path) -> tuple[list[Event], Snapshot | None]:
    from envguard.errors import EnvguardError
    from envguard.runs.store import last_good, list_runs, snapshot_path
    from envguard.snapshot_file import read_snapshot

    try:
        records = list_runs(cwd)
        good = last_good(cwd)
        recorded = read_snapshot(snapshot_path(cwd, good.snapshot), follow=False) if good else None
    except (EnvguardError, OSError):
        return [], None
    events = []
    for record in records:
        at = parse_iso(record.started_at)
        if at is not None:
            events.append(Event(at=at, kind=RUN, subject=record.id,
                                detail=f"{record.outcome}, gate {record.gate}",
                                evidence=".envguard/runs"))
    return events, recorded


def read_timeline(snapshot: Snapshot, *, cwd: Path | None = None,
                  now: float | None = None) -> Timeline:
    """Every event the disk holds for ``snapshot``'s environment (and envguard's runs
    recorded under ``cwd``), oldest first, grouped into episodes."""
    prefix = Path(snapshot.interpreter.prefix)
    notes: list[str] = []
    conda = conda_history(prefix, notes)
    made = created_at(prefix, conda)
    runs, recorded = _runs(cwd or Path.cwd())
    events: list[Event] = []
    if made is not None:
        events.append(Event(at=made[0], kind=CREATED, subject=str(prefix), evidence=made[1]))
    events += _installs(snapshot, made[0] if made else None, recorded)
    events += _modified_files(snapshot)
    events += _caches(snapshot)
    events += conda
    events += runs
    ordered = tuple(sorted(events, key=lambda e: (e.at, e.kind, e.subject)))
    return Timeline(environment=str(prefix), created_at=made[0] if made else None,
                    taken_at=now if now is not None else time.time(), events=ordered,
                    episodes=group(ordered), blind_spots=(*notes, *BLIND_SPOTS))
