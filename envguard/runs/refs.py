"""Names for recorded snapshots: ``@last-good``, ``@last-good:LOCK``, ``@latest``,
``@run:N`` (``@now`` and ``-`` are the CLI's: one takes a snapshot, the other reads stdin).

``@last-good:LOCK`` is the newest run of that lock that passed the gate and exited 0;
``@last-good`` is the newest of them all (one pointer file, moved by every such run)."""

from __future__ import annotations

import re
from pathlib import Path

from envguard.errors import InputError
from envguard.frozen import frozen
from envguard.model import Snapshot
from envguard.paths import SNAPSHOT_DIR
from envguard.probe.options import SnapshotOptions
from envguard.runs.store import (
    RECORD_SUFFIX,
    RunRecord,
    last_good,
    last_good_by_lock,
    last_good_of,
    list_runs,
    runs_dir,
    snapshot_path,
)

ALIASES = ("@last-good", "@last-good:LOCK", "@latest", "@run:N", "@now")
LAST_GOOD_OF = "@last-good:"
_RUN = re.compile(r"@run:([1-9][0-9]{0,8})")


@frozen
class Resolved:
    path: Path
    label: str
    """How a report names it: ``@last-good (run 20260101T...-demo-train)``."""
    run: RunRecord | None = None


def is_alias(ref: str) -> bool:
    return ref.startswith("@")


def _of_run(cwd: Path, alias: str, record: RunRecord) -> Resolved:
    path = snapshot_path(cwd, record.snapshot)
    if not path.is_file():
        raise InputError(f"{alias}: the snapshot of run {record.id} is gone ({record.snapshot})")
    return Resolved(path=path, label=f"{alias} (run {record.id}, {record.started_at})",
                    run=record)


def resolve(ref: str, cwd: Path) -> Resolved:
    """The recorded snapshot an alias names; InputError (exit 2, one line) for an unknown
    alias or one that names nothing yet. ``@now`` is not resolved here."""
    if ref == "@last-good":
        good = last_good(cwd)
        if good is None:
            raise InputError("@last-good: no successful guarded run recorded yet in "
                             f"{runs_dir(cwd)} (envguard run -- CMD)")
        return _of_run(cwd, ref, good)
    if ref.startswith(LAST_GOOD_OF):
        lock = ref.removeprefix(LAST_GOOD_OF)
        mine = last_good_of(cwd, lock) if lock else None
        if mine is None:
            locks = sorted(last_good_by_lock(cwd))
            known = f" (locks with one: {', '.join(locks)})" if locks else ""
            raise InputError(f"{ref}: no successful guarded run of lock {lock!r} recorded in "
                             f"{runs_dir(cwd)}{known}")
        return _of_run(cwd, ref, mine)
    match = _RUN.fullmatch(ref)
    if match:
        n = int(match.group(1))
        records = list_runs(cwd)
        if n > len(records):
            raise InputError(f"{ref}: no such run ({len(records)} recorded)")
        return _of_run(cwd, ref, records[n - 1])
    if ref == "@latest":
        return _latest(cwd)
    raise InputError(f"unknown alias {ref!r} (known: {', '.join(ALIASES)})")


def _latest(cwd: Path) -> Resolved:
    """The newest snapshot envguard recorded here: a guarded run's, or ``envguard
    snapshot``'s in ``.envguard/snapshots/``, whichever was taken last."""
    records = list_runs(cwd)
    run = _of_run(cwd, "@latest", records[0]) if records else None
    folder = cwd / SNAPSHOT_DIR
    saved = sorted((p for p in folder.glob("*.json") if p.is_file()),
                   key=lambda p: p.stat().st_mtime) if folder.is_dir() else []
    if saved and (run is None
                  or saved[-1].stat().st_mtime > _mtime_of_record(cwd, records[0])):
        return Resolved(path=saved[-1], label=f"@latest ({SNAPSHOT_DIR / saved[-1].name})")
    if run is None:
        raise InputError("@latest: no snapshot recorded yet here (envguard snapshot, or "
                         "envguard run -- CMD)")
    return run


def _mtime_of_record(cwd: Path, record: RunRecord) -> float:
    path = runs_dir(cwd) / f"{record.id}{RECORD_SUFFIX}"
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def gate_options_for(run: RunRecord, snapshot: Snapshot) -> SnapshotOptions | None:
    """How to take ``@now`` so that it compares like for like with ``run``'s snapshot: the
    gate's options for the run's lock, in the run's interpreter; None when the lockfile is
    gone (then a plain snapshot is taken)."""
    from envguard.gate.command import gate_snapshot_options
    from envguard.gate.lookup import project_root_of, read_lock

    if not run.lockfile:
        return None
    path = Path(run.lockfile)
    try:
        lock = read_lock(path)
    except InputError:
        return None
    return gate_snapshot_options(lock, project_root_of(path),
                                 python=snapshot.interpreter.executable or None)
