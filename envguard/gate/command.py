"""The gate for one command, end to end: the one way every caller builds the gate's snapshot.

``envguard check``, ``envguard run``, ``envguard lock`` and the dflash trainer's own
gate all take their snapshot options from :func:`gate_snapshot_options`, so a lock is
checked the same way whoever checks it.
"""

from __future__ import annotations

from pathlib import Path

from envguard.gate.check import GateResult, check
from envguard.gate.lockfile import Lock, validate_name
from envguard.gate.lookup import find_lock, project_root_of, read_lock
from envguard.probe import SnapshotOptions, collect


def gate_snapshot_options(lock: Lock, project_root: Path, *, python: str | None = None,
                          fast: bool = True) -> SnapshotOptions:
    """What the gate records. ``fast``: RECORD checks for the locked packages and the
    command's own distribution only, and no git. Nothing is written into the compile
    caches (docs/CACHE.md, Provenance). ``[tool.envguard] env`` of the project's
    pyproject.toml applies, as to every snapshot; its ``files`` come from the lock."""
    patterns = tuple(str(project_root / p) for p in lock.file_patterns)
    names = {p.name for e in lock.entries for p in e.packages} | {lock.distribution}
    return SnapshotOptions(
        python=python, file_patterns=patterns, cwd=project_root, project_files=False,
        git=not fast, integrity_only=frozenset(names) if fast and lock.entries else None)


def check_command(name: str, *, lock: str | Path | None = None, python: str | None = None,
                  cwd: Path | None = None, strict: bool = False) -> GateResult:
    """Does the environment of ``python`` (default: this one) match the lock of command
    ``name``? The lock is ``lock`` if given, else ``lockfiles/NAME.toml`` under ``cwd``
    (default: the working directory) or the bundled one. ``strict``: every distribution
    must match the entry's full snapshot, not only the command's closure."""
    path = Path(lock) if lock else find_lock(validate_name(name), cwd or Path.cwd())
    parsed = read_lock(path)
    root = project_root_of(path)
    snapshot = collect(gate_snapshot_options(parsed, root, python=python, fast=not strict))
    return check(snapshot, parsed, str(path), root, strict=strict)
