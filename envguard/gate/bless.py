"""``envguard lock``: bless an environment as known-good for a command.

Writes (or updates) ``lockfiles/NAME.toml`` with the environment as one entry, keeping
the other machines' entries, and its full snapshot beside the lock in
``NAME.snapshots/<entry>.json``.

Several ``envguard lock`` at once (one per node of a job) keep every entry: the snapshot is
taken first, then, under an exclusive ``flock`` of ``.NAME.toml.lock`` beside the TOML, the
lock is read again, the entry added and both files written.

The TOML, the ``NAME.snapshots`` folder, its files and the ``.lock`` file are envguard's
state (a repository may commit symlinks): a link among them is refused with one line
(exit 5) before anything is written, and nothing is ever written through one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import stat
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from envguard.atomic import check_state_path, write_text_atomic
from envguard.errors import InputError, OutputError
from envguard.explain.tables import DEFAULT_FORBIDDEN
from envguard.frozen import frozen
from envguard.gate.command import gate_snapshot_options
from envguard.gate.lockfile import (
    Lock,
    LockEntry,
    build_entry,
    dump_lock,
    hash_files,
    refuse_credential,
    script_owner,
    validate_name,
)
from envguard.gate.lookup import project_root_of, read_lock
from envguard.model import Snapshot


@frozen
class LockRequest:
    """What ``envguard lock`` was asked; None: keep the lock's value (or the default)."""

    name: str
    lock_path: str | None = None
    from_snapshot: str | None = None
    python: str | None = None
    entry_id: str | None = None
    distribution: str | None = None
    extras: tuple[str, ...] | None = None
    file_patterns: tuple[str, ...] | None = None
    cache_policy: str | None = None
    forbidden: tuple[str, ...] | None = None


@frozen
class Blessed:
    path: Path
    lock: Lock
    entry: LockEntry
    replaced: bool
    """An entry of the same id was there before."""


def _merged(request: LockRequest, name: str, existing: Lock | None) -> Lock:
    lock = existing or Lock(name=name, command=name, distribution=request.distribution or "")
    return dataclasses.replace(
        lock,
        distribution=request.distribution or lock.distribution,
        extras=request.extras if request.extras is not None else lock.extras,
        file_patterns=(request.file_patterns if request.file_patterns is not None
                       else lock.file_patterns),
        cache_policy=request.cache_policy or lock.cache_policy,
        forbidden=request.forbidden if request.forbidden is not None else
        (lock.forbidden if existing else DEFAULT_FORBIDDEN))


def _snapshot(request: LockRequest, lock: Lock, root: Path) -> Snapshot:
    if request.from_snapshot:
        from envguard.snapshot_file import read_snapshot

        return read_snapshot(request.from_snapshot)
    from envguard.probe import collect

    return collect(gate_snapshot_options(lock, root, python=request.python, fast=False))


LOCK_WAIT_S = 120.0
"""How long ``envguard lock`` waits for another one writing the same lockfile."""


@contextlib.contextmanager
def exclusive(path: Path, *, wait_s: float = LOCK_WAIT_S) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``.<name>.lock`` beside ``path`` (made if needed; never
    removed, since removing a lock file races with the next process that opens it)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX: no locking
        yield
        return
    lock_file = path.parent / f".{path.name}.lock"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # Not followed if a link, not opened if a FIFO or device (which could block).
        fd = os.open(lock_file, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
                     | os.O_NONBLOCK, 0o666)
    except OSError as exc:
        why = "a symbolic link, not followed" if os.path.islink(lock_file) else \
            exc.strerror or exc
        raise OutputError(f"cannot lock {path}: {lock_file}: {why}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OutputError(f"cannot lock {path}: {lock_file} is not a regular file")
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise OutputError(f"cannot lock {path}: another envguard lock has held "
                                      f"{lock_file} for {wait_s:g} s") from None
                time.sleep(0.05)
        yield
    finally:
        os.close(fd)  # releases the lock


def bless(request: LockRequest) -> Blessed:
    name = validate_name(request.name)
    if request.entry_id is not None:
        validate_name(request.entry_id, "entry id")
    path = Path(request.lock_path) if request.lock_path else Path("lockfiles") / f"{name}.toml"
    root = project_root_of(path)
    # An existing lock that is a FIFO or a device: the reader's one line (exit 2); a link
    # (a planted one can point anywhere) is never read, and refused before the long probe.
    existing = read_lock(path) if path.exists() and not path.is_symlink() else None
    check_state_path(path, path.parent)
    snapshot = _snapshot(request, _merged(request, name, existing), root)
    with exclusive(path):
        # Read again: another envguard lock may have added its entry while this one probed.
        existing = read_lock(path) if path.exists() else None
        return _write(request, name, path, root, existing, snapshot)


def _write(request: LockRequest, name: str, path: Path, root: Path, existing: Lock | None,
           snapshot: Snapshot) -> Blessed:
    lock = _merged(request, name, existing)
    if not lock.distribution:
        # A plain `python train.py`: no console script, so the project's own dependencies.
        owner = script_owner(snapshot, lock.command) or _project_of(root)
        if owner is None:
            raise InputError(f"no installed distribution provides the command {lock.command!r}"
                             " and no pyproject.toml names a project here; pass --distribution")
        lock = dataclasses.replace(lock, distribution=owner[0],
                                   extras=lock.extras or owner[1])
    forbidden = lock.forbidden_installed(snapshot)
    if forbidden:
        raise InputError(f"will not lock an environment with forbidden packages installed: "
                         f"{', '.join(forbidden)} (uninstall them, or change --forbid)")
    entry = build_entry(snapshot, lock, entry_id=request.entry_id, project_root=root)
    lock = dataclasses.replace(lock, files=hash_files(lock, root))
    _refuse_credentials(lock, entry)
    snap_rel = f"{name}.snapshots/{entry.id}.json"
    check_state_path(path, path.parent)  # both refused before either is written
    check_state_path(path.parent / snap_rel, path.parent)
    entry = dataclasses.replace(entry, snapshot_file=snap_rel)
    lock = lock.with_entry(entry)
    snapshot_text, lock_text = snapshot.to_json(), dump_lock(lock)
    _utf8(snapshot_text, lock_text)  # neither written unless both can be
    write_text_atomic(path.parent / snap_rel, snapshot_text, state_root=path.parent)
    write_text_atomic(path, lock_text, state_root=path.parent)
    replaced = existing is not None and any(e.id == entry.id for e in existing.entries)
    return Blessed(path=path, lock=lock, entry=entry, replaced=replaced)


def _utf8(*texts: str) -> None:
    """A lock and its snapshot are UTF-8 files: text that is not (the non-UTF-8 name of a
    file a ``--file`` pattern matched, kept by Python as surrogate escapes) is refused."""
    for text in texts:
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise InputError("the lock would hold text that is not valid UTF-8 (the name of "
                             "a file a --file pattern matches, or a value in the snapshot), "
                             "which a lock (UTF-8 TOML) cannot hold: rename it or narrow the "
                             "pattern") from None


def _refuse_credentials(lock: Lock, entry: LockEntry) -> None:
    """Every name the lock would record (and ``check`` would show), credential-free."""
    fields = [("entry id", entry.id), ("command", lock.command),
              ("--distribution", lock.distribution)]
    fields += [("--extra", x) for x in lock.extras]
    fields += [("--forbid", x) for x in lock.forbidden]
    fields += [("--file", x) for x in lock.file_patterns]
    fields += [("a pinned file", f.path) for f in lock.files]
    for what, text in fields:
        refuse_credential(text, what)


def _project_of(root: Path) -> tuple[str, tuple[str, ...]] | None:
    """The project named by ``root/pyproject.toml`` (its dependencies are the closure)."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib
    from envguard.input_file import read_input_text

    try:
        data = tomllib.loads(read_input_text(root / "pyproject.toml", what="pyproject.toml"))
    except (InputError, tomllib.TOMLDecodeError):
        return None
    project = data.get("project")
    name = project.get("name") if isinstance(project, dict) else None
    return (name, ()) if isinstance(name, str) and name else None
