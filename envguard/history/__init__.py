"""``envguard history``: what happened to an environment, reconstructed from the disk.

No earlier snapshot is needed. Installers leave times behind: each distribution's
``.dist-info`` (its ``RECORD`` and ``INSTALLER``) is written when it is installed, a file
edited after that is newer than its ``RECORD``, a compile cache's entries carry the times
they were written, conda keeps ``conda-meta/history``, and envguard keeps its own run
records. :func:`read_timeline` gathers them (:mod:`.collect`) into :class:`Event` s, and
:func:`group` puts the events that happened together into one :class:`Episode`
("14:02 one install: sglang, flashinfer-python and 31 others"). A recorded run is an
episode of its own: no install episode spans one.

Each package event says its direction (:attr:`Event.change`): installed, upgraded,
downgraded, reinstalled, removed, or replaced (installed again over an install whose
version the disk does not keep). The versions replaced come from the snapshots recorded
runs keep (:mod:`.recorded`) and from conda's history (:mod:`.conda`); nothing else on
disk names them, and the timeline says so rather than guess. docs/HISTORY.md says more.
"""

from __future__ import annotations

from dataclasses import field
from datetime import datetime, timezone
from typing import Any

from envguard.frozen import frozen

GAP_S = 120.0
"""Events closer than this to the previous one belong to the same episode (one install
writes its packages within seconds; a large one within a minute or two)."""

INSTALLED = "installed"
REINSTALLED = "reinstalled"
FILE_MODIFIED = "file-modified"
CACHE_CREATED = "cache-created"
CACHE_WRITTEN = "cache-written"
CONDA = "conda"
CONDA_INSTALLED = "conda-installed"
"""A ``conda-meta/*.json`` record's time, used when ``conda-meta/history`` is empty
(rattler and pixi leave it so)."""
RECORDED = "recorded-change"
"""A change two recorded snapshots show that left no time on disk (a removal): it
happened after :attr:`Event.not_before` and by :attr:`Event.at`."""
RUN = "run"
REVISION = "envguard-change"
"""A change made through ``envguard install``, ``undo`` or ``restore --in-place``."""
CREATED = "environment-created"

# Directions (:attr:`Event.change`).
NEW = "installed"
UPGRADED = "upgraded"
DOWNGRADED = "downgraded"
REBUILT = "reinstalled"
REMOVED = "removed"
REPLACED = "replaced"
"""Installed again over an earlier install whose version the disk does not keep."""
CHANGED = "changed"
"""Another version, of a version scheme that cannot be ordered."""

BLIND_SPOTS = (
    "removed packages leave no trace on disk (a recorded snapshot, `envguard runs`, or "
    "conda's history names them)",
    "an install that replaced an older one keeps only its own time; the version it "
    "replaced is known only from a recorded snapshot",
    "uv links files from its cache, so a file's own time can be older than its install; "
    "install times come from the .dist-info folder instead",
)


@frozen
class Event:
    at: float
    """Unix time."""
    kind: str
    """:data:`INSTALLED`, :data:`REINSTALLED`, :data:`FILE_MODIFIED`, :data:`CACHE_CREATED`,
    :data:`CACHE_WRITTEN`, :data:`CONDA`, :data:`RUN` or :data:`CREATED`."""
    subject: str
    """A distribution's name, a file, a cache folder or a run id."""
    detail: str = ""
    """Version and installer, the package a file belongs to, the run's outcome, ..."""
    evidence: str = ""
    """Where the time comes from (``torch-2.11.0.dist-info/RECORD``)."""
    change: str = ""
    """A package's direction: :data:`NEW`, :data:`UPGRADED`, :data:`DOWNGRADED`,
    :data:`REBUILT`, :data:`REMOVED`, :data:`REPLACED` or :data:`CHANGED`; empty for other
    events, and for an install the disk cannot tell from a replacement (no recorded run
    before it)."""
    version: str | None = None
    """The package's version after the event (None for a removal or another event)."""
    old: str | None = None
    """The version it replaced, where a recorded snapshot or conda's history names it."""
    ended_at: float | None = None
    """A run's end."""
    not_before: float | None = None
    """A :data:`RECORDED` change happened after this (the earlier run's end)."""

    def to_dict(self) -> dict[str, Any]:
        return {"at": self.at, "kind": self.kind, "subject": self.subject,
                "detail": self.detail, "evidence": self.evidence, "change": self.change,
                "version": self.version, "old": self.old, "ended_at": self.ended_at,
                "not_before": self.not_before}

    @property
    def arrow(self) -> str:
        """``helperlib 2.0 → 1.0``, ``sglang 0.5.6``, ``flash-attn 2.8.3`` (removed),
        ``torch 2.11.0 (same version, other build)``."""
        if self.old is not None and self.old == self.version:
            return f"{self.subject} {self.version} (same version, other build)"
        if self.old is not None and self.version is not None:
            return f"{self.subject} {self.old} → {self.version}"
        return f"{self.subject} {self.version or self.old or ''}".strip()


@frozen
class Episode:
    """Events that happened together, oldest first."""

    events: tuple[Event, ...]

    @property
    def start(self) -> float:
        return self.events[0].at

    @property
    def end(self) -> float:
        return self.events[-1].at

    def of_kind(self, *kinds: str) -> list[Event]:
        return [e for e in self.events if e.kind in kinds]

    @property
    def run(self) -> str | None:
        """The run id when this episode is a recorded run (and what happened during it)."""
        return self.events[0].subject if self.events[0].kind == RUN else None


@frozen
class Timeline:
    environment: str
    """The environment's folder."""
    created_at: float | None
    """When the environment was made (``pyvenv.cfg``, conda's first history entry)."""
    taken_at: float
    events: tuple[Event, ...]
    """Oldest first."""
    episodes: tuple[Episode, ...] = field(default=())
    blind_spots: tuple[str, ...] = BLIND_SPOTS

    def last_install(self, name: str) -> Event | None:
        """The newest install or reinstall event of distribution ``name``."""
        return max((e for e in self.events
                    if e.subject == name and e.kind in (INSTALLED, REINSTALLED)),
                   key=lambda e: e.at, default=None)

    def installed_at(self, name: str) -> float | None:
        """When distribution ``name`` was last (re)installed, if the disk says."""
        event = self.last_install(name)
        return event.at if event is not None else None

    def episode_of(self, name: str) -> Episode | None:
        """The episode in which ``name`` was last (re)installed."""
        at = self.installed_at(name)
        return next((ep for ep in self.episodes if ep.start <= (at or -1) <= ep.end), None)

    def since(self, cutoff: float) -> Timeline:
        """Only the events at or after ``cutoff``."""
        kept = tuple(e for e in self.events if e.at >= cutoff)
        return Timeline(environment=self.environment, created_at=self.created_at,
                        taken_at=self.taken_at, events=kept, episodes=group(kept),
                        blind_spots=self.blind_spots)

    def to_dict(self) -> dict[str, Any]:
        return {"schema": "envguard.history/1", "environment": self.environment,
                "created_at": self.created_at, "taken_at": self.taken_at,
                "events": [e.to_dict() for e in self.events],
                "episodes": [{"start": ep.start, "end": ep.end, "summary": summarize(ep),
                              "events": len(ep.events), "run": ep.run}
                             for ep in self.episodes],
                "blind_spots": list(self.blind_spots)}


def group(events: tuple[Event, ...], gap_s: float = GAP_S) -> tuple[Episode, ...]:
    """Consecutive events no more than ``gap_s`` apart, as episodes; a recorded run starts
    an episode of its own, holding what happened while it ran, so that an install before
    a run and one after it are two episodes however close in time."""
    episodes: list[list[Event]] = []
    run_end: float | None = None
    """While the open episode is a run's: when that run ended."""
    for event in sorted(events, key=lambda e: (e.at, e.kind, e.subject)):
        if event.kind in (RUN, REVISION):
            episodes.append([event])
            run_end = max(event.at, event.ended_at or event.at)
        elif episodes and (event.at - episodes[-1][-1].at <= gap_s if run_end is None
                           else event.at <= run_end):
            episodes[-1].append(event)
        else:
            episodes.append([event])
            run_end = None
    return tuple(Episode(events=tuple(ep)) for ep in episodes)


def _names(events: list[Event], limit: int = 4) -> str:
    shown = [e.arrow if e.version is not None or e.old is not None
             else f"{e.subject} {e.detail.split(' ')[0]}".strip() for e in events[:limit]]
    more = len(events) - limit
    text = ", ".join(shown)
    return f"{text} and {more} other{'s' if more > 1 else ''}" if more > 0 else text


_DIRECTED = (UPGRADED, DOWNGRADED, CHANGED, REBUILT, REMOVED)


def _packages(events: list[Event], prefix: str, first: bool) -> list[str]:
    """The parts of a summary for package events of one kind: plain installs together,
    then each direction a recorded snapshot or conda's history names."""
    parts = []
    plain = [e for e in events if e.change in ("", NEW)]
    if plain:
        parts.append(f"{prefix}{'one install' if len(plain) > 1 else 'installed'}: "
                     f"{_names(plain)}")
        if not first and any(e.change == "" for e in plain):
            parts[-1] += " (whether it replaced earlier versions is not on disk)"
    for change in _DIRECTED:
        moved = [e for e in events if e.change == change]
        if moved:
            parts.append(f"{prefix}{change}: {_names(moved)}")
    return parts


def summarize(episode: Episode) -> str:
    """One line: ``one install: sglang 0.5.0, flashinfer-python 0.4.0 and 31 others;
    downgraded: numpy 2.1.0 → 1.26.4; torch 2.11.0 installed again (...)``."""
    parts: list[str] = []
    created = episode.of_kind(CREATED)
    if created:
        parts.append("environment created")
    for event in episode.of_kind(RUN):
        parts.append(f"run: {event.subject}" + (f" ({event.detail})" if event.detail else ""))
    for event in episode.of_kind(REVISION):
        parts.append(f"{event.detail} ({event.subject})")
    installs = episode.of_kind(INSTALLED, REINSTALLED)
    parts += _packages([e for e in installs if e.change != REPLACED], "", bool(created))
    parts += [f"{e.subject} {e.detail}" for e in installs if e.change == REPLACED]
    parts += _packages(episode.of_kind(CONDA_INSTALLED), "conda ", bool(created))
    for event in episode.of_kind(RECORDED):
        window = (f"between {utc(event.not_before)} and {utc(event.at)}"
                  if event.not_before is not None else f"by {utc(event.at)}")
        parts.append(f"{event.change}: {event.arrow} ({window}, seen in recorded snapshots; "
                     "the disk keeps no time for it)")
    modified = episode.of_kind(FILE_MODIFIED)
    if modified:
        parts.append(f"{len(modified)} installed file(s) modified: "
                     + ", ".join(f"{e.subject} ({e.detail})" for e in modified[:3])
                     + (" ..." if len(modified) > 3 else ""))
    for event in episode.of_kind(CACHE_CREATED, CACHE_WRITTEN, CONDA):
        parts.append(f"{event.kind.replace('-', ' ')}: {event.subject}"
                     + (f" ({event.detail})" if event.detail else ""))
    return "; ".join(parts)


def parse_iso(text: str) -> float | None:
    """``2026-12-04T14:02:00Z`` (or with an offset) as Unix time; None if it is not one."""
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def utc(at: float) -> str:
    """``2026-12-04 14:02 UTC``."""
    return datetime.fromtimestamp(at, timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def ago_text(seconds: float) -> str:
    """``38 min``, ``5 h``, ``3 days``."""
    seconds = max(0.0, seconds)
    for unit, size in (("day", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            n = int(seconds // size)
            return f"{n} {unit}{'s' if unit == 'day' and n > 1 else ''}"
    return "seconds"


def install_evidence(timeline: Timeline, names: list[str], reference: float) -> list[str]:
    """``torch was reinstalled at 2026-12-04 14:02 UTC, 38 min before this snapshot`` for
    each of ``names`` whose install time the disk holds (``reference``: the snapshot's
    time)."""
    lines = []
    for name in names:
        event = timeline.last_install(name)
        if event is None:
            continue
        verb = "reinstalled" if event.kind == REINSTALLED else "installed"
        lines.append(f"{name} was {verb} at {utc(event.at)}, "
                     f"{ago_text(reference - event.at)} before this snapshot "
                     f"(from {event.evidence or 'the disk'})")
    return lines
