"""The locks an install must not break: ``lockfiles/*.toml`` in the working directory whose
entry this environment matches now (:mod:`envguard.gate`). A change that would make such a
lock refuse (a forbidden package installed, a pinned build replaced) is refused like the
gate refuses a launch, naming the lock."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from envguard.errors import InputError
from envguard.findings import Finding
from envguard.frozen import frozen
from envguard.model import Snapshot

if TYPE_CHECKING:  # the gate is imported only where ./lockfiles holds a lock (0.1 s)
    from envguard.gate.lockfile import Lock

LOCK_FOLDER = "lockfiles"


@frozen
class LockVerdict:
    """A lock this environment matches now that the change would break."""

    name: str
    path: str
    findings: tuple[Finding, ...]
    """The gate's findings against the predicted environment."""
    forbidden: tuple[str, ...] = ()
    """Packages the lock forbids that the change installs."""


@frozen
class FoundLock:
    lock: Lock
    path: Path


def read_locks(cwd: Path) -> tuple[list[FoundLock], tuple[str, ...]]:
    """Every lockfile in ``cwd/lockfiles``, and a note for each that cannot be read."""
    folder = cwd / LOCK_FOLDER
    if not folder.is_dir():
        return [], ()
    from envguard.gate.lookup import read_lock

    found, notes = [], []
    for path in sorted(folder.glob("*.toml")):
        try:
            found.append(FoundLock(lock=read_lock(path), path=path))
        except InputError as exc:
            notes.append(f"lock not read: {exc}")
    return found, tuple(notes)


def lock_patterns(locks: list[FoundLock]) -> tuple[str, ...]:
    """The files the locks pin, as absolute patterns (the snapshot hashes them)."""
    if not locks:
        return ()
    from envguard.gate.lookup import project_root_of

    return tuple(dict.fromkeys(str(project_root_of(f.path) / p)
                               for f in locks for p in f.lock.file_patterns))


def broken_locks(before: Snapshot, predicted: Snapshot, locks: list[FoundLock]
                 ) -> tuple[tuple[LockVerdict, ...], tuple[str, ...]]:
    """(the locks matched now and broken by the prediction, every lock matched now)."""
    if not locks:
        return (), ()
    from envguard.gate.check import check
    from envguard.gate.lookup import project_root_of

    broken, matched = [], []
    for found in locks:
        root = project_root_of(found.path)
        now = check(before, found.lock, str(found.path), root)
        if now.matched is None:
            continue
        matched.append(str(found.path))
        after = check(predicted, found.lock, str(found.path), root)
        if after.matched is None:
            forbidden = set(found.lock.forbidden_installed(predicted)) - set(
                found.lock.forbidden_installed(before))
            broken.append(LockVerdict(name=found.lock.name, path=str(found.path),
                                      findings=after.findings,
                                      forbidden=tuple(sorted(forbidden))))
    return tuple(broken), tuple(matched)
