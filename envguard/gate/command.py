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
    names = {p.name for e in lock.entries for p in e.packages} | set(lock.roots())
    return SnapshotOptions(
        python=python, file_patterns=patterns, cwd=project_root, project_files=False,
        git=not fast, integrity_only=frozenset(names) if fast and lock.entries else None)


def check_command(name: str, *, lock: str | Path | None = None, python: str | None = None,
                  cwd: Path | None = None, strict: bool = False,
                  relock_python: str | None = None) -> GateResult:
    """Does the environment of ``python`` (default: this one) match the lock of command
    ``name``? The lock is ``lock`` if given, else ``lockfiles/NAME.toml`` under ``cwd``
    (default: the working directory) or the bundled one. ``strict``: every distribution
    must match the entry's full snapshot, not only the command's closure.
    ``relock_python``: the ``--python`` a refusal's re-lock command names (None: none, the
    environment ``envguard lock`` finds by itself is this one)."""
    here = cwd or Path.cwd()
    path = Path(lock) if lock else find_lock(validate_name(name), here)
    parsed = read_lock(path)
    root = project_root_of(path)
    snapshot = collect(gate_snapshot_options(parsed, root, python=python, fast=not strict))
    result = check(snapshot, parsed, str(path), root, strict=strict)
    if result.passed:
        return result
    import dataclasses

    from envguard.gate.check import next_step

    relock = relock_args(parsed, path, here, relock_python)
    return dataclasses.replace(result, relock=relock, next_step=next_step(result, relock))


def relock_args(lock: Lock, path: Path, cwd: Path, python: str | None) -> tuple[str, ...]:
    """The arguments of ``envguard lock`` that write this environment into the lock at
    ``path``: ``NAME``, with ``--lock`` unless it is ``lockfiles/NAME.toml`` here (none for a
    bundled lock either: a new lock here is found before it), and ``--python``."""
    from envguard.gate.lookup import bundled_lock_dirs

    argv = [lock.name]
    folder = path.resolve().parent
    default = cwd.resolve() / "lockfiles"
    if path.name != f"{lock.name}.toml" or not (
            folder == default or folder in bundled_lock_dirs()):
        import os

        shown = os.path.relpath(path.absolute(), cwd.absolute())
        argv += ["--lock", shown if not shown.startswith("..") else str(path.absolute())]
    if python:
        argv += ["--python", python]
    return tuple(argv)
