"""A conda prefix's events: ``conda-meta/history``, else the times of its records.

conda and mamba append one transaction to ``conda-meta/history`` each time they change a
prefix: its time, its command, the packages added (``+``) and removed (``-``); a name in
both is a package whose version or build changed, named here with its direction.
rattler and pixi create that file and leave it empty. Then each ``conda-meta/*.json``
record's modification time is when that package was linked into the prefix (an installer
writes a package's record after its files, and leaves the records of the packages a
transaction keeps alone), and the empty history file's own time is when the first
transaction made the prefix.

A record's ``timestamp`` field is not an install time: it is copied from the package's
``info/index.json`` and says when the package was built, often months earlier.
"""

from __future__ import annotations

import re
from datetime import datetime
from pathlib import Path

from envguard.history import CONDA, CONDA_INSTALLED, REBUILT, Event
from envguard.history.recorded import direction
from envguard.input_file import METADATA_BYTES, NotReadable, read_bounded_text
from envguard.model import Snapshot

_CONDA_HEADER = re.compile(r"^==> (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) <==$")
MAX_CONDA_HISTORY_BYTES = METADATA_BYTES


def _mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except OSError:
        return None


def _split(spec: str) -> tuple[str, str, str] | None:
    """``defaults::cudnn-9.1.0-cuda12_0`` -> (``cudnn``, ``9.1.0``, ``cuda12_0``)."""
    parts = spec.split("::")[-1].rsplit("-", 2)
    return (parts[0], parts[1], parts[2]) if len(parts) == 3 and all(parts) else None


def _directions(added: list[str], removed: list[str]) -> str:
    """``downgraded: cudnn 9.1.0 → 8.9.7; reinstalled: nccl 2.18.5.1 (other build)`` for
    each name a transaction both removed and added."""
    gone = {s[0]: s for s in map(_split, removed) if s is not None}
    said: dict[str, list[str]] = {}
    for new in (s for s in map(_split, added) if s is not None):
        old = gone.get(new[0])
        if old is None:
            continue
        if old[1] == new[1]:
            said.setdefault(REBUILT, []).append(f"{new[0]} {new[1]} (build {old[2]} → {new[2]})")
        else:
            said.setdefault(direction(old[1], new[1]), []).append(f"{new[0]} {old[1]} → {new[1]}")
    return "; ".join(f"{change}: {', '.join(names)}" for change, names in sorted(said.items()))


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
            moved = _directions(added, removed)
            events.append(Event(at=at, kind=CONDA, subject=command or "conda transaction",
                                detail=" ".join(w for w in what if w)
                                + (f": {names}" if names else "")
                                + (f"; {moved}" if moved else ""),
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


def record_events(snapshot: Snapshot, prefix: Path) -> list[Event]:
    """One event per conda package, at its ``conda-meta`` record's modification time:
    what a prefix whose ``conda-meta/history`` holds no transaction (rattler, pixi) says
    of when each package was linked. The direction is left to recorded runs
    (:mod:`envguard.history.recorded`): a record replaced keeps nothing of the old one."""
    events = []
    for package in snapshot.conda:
        name = f"{package.name}-{package.version}-{package.build}.json"
        at = _mtime(prefix / "conda-meta" / name)
        if at is not None:
            events.append(Event(at=at, kind=CONDA_INSTALLED, subject=package.name,
                                version=package.version,
                                detail=f"{package.version} {package.build} "
                                       f"({package.channel or 'unknown channel'})",
                                evidence=f"conda-meta/{name}"))
    return events


def created(prefix: Path, history: list[Event], records: list[Event]
            ) -> tuple[float, str] | None:
    """When a conda prefix was made: the first transaction of its history; with an empty
    history, that file's own time (written by the first transaction, untouched by later
    ones) or the oldest record's, whichever is older."""
    if history:
        return history[0].at, "conda-meta/history"
    found = [(at, "conda-meta/history (empty; its file time)")
             for at in (_mtime(prefix / "conda-meta" / "history"),) if at is not None]
    if records:
        oldest = min(records, key=lambda e: e.at)
        found.append((oldest.at, f"{oldest.evidence} (the oldest record)"))
    return min(found) if found else None
