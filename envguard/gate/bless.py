"""``envguard lock``: bless an environment as known-good for a command.

Writes (or updates) ``lockfiles/NAME.toml`` with the environment as one entry, keeping
the other machines' entries, and its full snapshot beside the lock in
``NAME.snapshots/<entry>.json``.

What a new lock pins: the closure of the distributions ``--distribution`` and ``-r`` name;
else of the distribution whose console script NAME is, or of the project its
``pyproject.toml`` names; else, with no such metadata, every distribution of the
environment (scope ``environment``).

Several ``envguard lock`` at once (one per node of a job) keep every entry: the snapshot is
taken first, then, under an exclusive ``flock`` of ``.NAME.toml.lock`` beside the TOML, the
lock is read again, the entry added and both files written. Everything that can refuse is
tried before the ``.lock`` file or the folder is made: a refused lock leaves nothing behind.

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
from envguard.flock import CAN_FLOCK, flock_until
from envguard.frozen import frozen
from envguard.gate.command import gate_snapshot_options
from envguard.gate.lockfile import (
    SCOPE_CLOSURE,
    SCOPE_ENVIRONMENT,
    Lock,
    LockEntry,
    build_entry,
    dump_lock,
    hash_files,
    marker_environment,
    refuse_credential,
    script_owner,
    validate_name,
)
from envguard.gate.lookup import project_root_of, read_lock
from envguard.gate.requirements import Wanted, applicable, read_requirements
from envguard.model import Snapshot


@frozen
class LockRequest:
    """What ``envguard lock`` was asked; None: keep the lock's value (or the default)."""

    name: str
    lock_path: str | None = None
    from_snapshot: str | None = None
    python: str | None = None
    entry_id: str | None = None
    distributions: tuple[str, ...] = ()
    """``--distribution``, in order: the first is the command's own (``--extra`` is its)."""
    requirement_files: tuple[str, ...] = ()
    """``-r``: the distributions these files name are roots of the closure too."""
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


def _merged(request: LockRequest, name: str, existing: Lock | None, root: Path) -> Lock:
    """The lock asked for, before its roots are resolved against the snapshot: what the
    request names, else what the existing lock says, else the defaults."""
    lock = existing or Lock(name=name, command=name, distribution="",
                            file_patterns=_project_files(root))
    extras = request.extras
    if request.distributions or request.requirement_files:  # new roots replace the old
        first, *rest = request.distributions or ("",)
        if extras is None and first != lock.distribution:
            extras = ()
        lock = dataclasses.replace(lock, distribution=first, requires=tuple(rest),
                                   scope=SCOPE_CLOSURE)
    return dataclasses.replace(
        lock,
        extras=extras if extras is not None else lock.extras,
        file_patterns=(request.file_patterns if request.file_patterns is not None
                       else lock.file_patterns),
        cache_policy=request.cache_policy or lock.cache_policy,
        forbidden=request.forbidden if request.forbidden is not None else
        (lock.forbidden if existing else DEFAULT_FORBIDDEN))


def _project_files(root: Path) -> tuple[str, ...]:
    """``[tool.envguard] files`` of ``root/pyproject.toml``, relative to it (a new lock's
    default for ``--file``); none without one."""
    from envguard.probe.files import project_config

    pyproject = root / "pyproject.toml"
    if not pyproject.is_file():
        return ()
    patterns, _ = project_config(pyproject)
    out = []
    for pattern in patterns:
        try:
            out.append(Path(pattern).relative_to(root).as_posix())
        except ValueError:
            out.append(pattern)  # an absolute pattern stays absolute
    return tuple(out)


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
    """Hold an exclusive ``flock`` on ``.<name>.lock`` beside ``path``, made if needed.

    A holder checks, once it has the lock, that the name still refers to the file it
    locked (else it opens the file again): so the one that made the file can remove it
    again when what it guards fails, and leaves nothing behind. After a success the file
    stays (a next writer may already be waiting on it)."""
    if not CAN_FLOCK:  # pragma: no cover - not POSIX: no locking
        yield
        return
    lock_file = path.parent / f".{path.name}.lock"
    made = _missing_folders(path.parent)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError(f"cannot lock {path}: {path.parent}: {exc.strerror or exc}") from None
    deadline = time.monotonic() + wait_s
    fd, created = _open_locked(path, lock_file, deadline, wait_s)
    try:
        yield
    except BaseException:
        if created:  # still ours: every other holder re-checks the name after locking
            with contextlib.suppress(OSError):
                os.unlink(lock_file)
            for folder in made:  # the innermost first; only if left empty
                with contextlib.suppress(OSError):
                    folder.rmdir()
        raise
    finally:
        os.close(fd)  # releases the lock


def _missing_folders(folder: Path) -> list[Path]:
    """``folder`` and those of its parents that do not exist yet, innermost first."""
    missing = []
    while not folder.exists() and folder != folder.parent:
        missing.append(folder)
        folder = folder.parent
    return missing


def _open_locked(path: Path, lock_file: Path, deadline: float,
                 wait_s: float) -> tuple[int, bool]:
    """(fd of ``lock_file``, flocked; whether this call made the file)."""
    flags = os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK
    while True:
        if time.monotonic() > deadline:
            raise OutputError(f"cannot lock {path}: {lock_file} kept being removed for "
                              f"{wait_s:g} s")
        created = True
        try:
            # Not followed if a link, not opened if a FIFO or device (which could block).
            try:
                fd = os.open(lock_file, flags | os.O_CREAT | os.O_EXCL, 0o666)
            except FileExistsError:
                created = False
                fd = os.open(lock_file, flags)
        except FileNotFoundError:  # removed, or its folder, by a maker that failed
            with contextlib.suppress(OSError):
                path.parent.mkdir(parents=True, exist_ok=True)
            continue
        except OSError as exc:
            why = "a symbolic link, not followed" if os.path.islink(lock_file) else \
                exc.strerror or exc
            raise OutputError(f"cannot lock {path}: {lock_file}: {why}") from None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise OutputError(f"cannot lock {path}: {lock_file} is not a regular file")
            if not flock_until(fd, deadline):
                raise OutputError(f"cannot lock {path}: another envguard lock has held "
                                  f"{lock_file} for {wait_s:g} s")
            if _same_file(fd, lock_file):
                return fd, created
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)  # its maker removed it while this one waited: lock the new one


def _same_file(fd: int, name: Path) -> bool:
    try:
        now = os.stat(name, follow_symlinks=False)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (held.st_dev, held.st_ino) == (now.st_dev, now.st_ino)


@frozen
class _Plan:
    """Everything ``envguard lock`` writes, made and checked before any of it is."""

    lock: Lock
    entry: LockEntry
    snapshot_rel: str
    snapshot_text: str
    lock_text: str


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
    wanted = tuple(w for f in request.requirement_files for w in read_requirements(Path(f)))
    snapshot = _snapshot(request, _merged(request, name, existing, root), root)
    _plan(request, name, path, root, existing, snapshot, wanted)  # refused before any write
    with exclusive(path):
        # Read again: another envguard lock may have added its entry while this one probed.
        existing = read_lock(path) if path.exists() else None
        plan = _plan(request, name, path, root, existing, snapshot, wanted)
        snapshot_file = path.parent / plan.snapshot_rel
        made = _missing_folders(snapshot_file.parent)
        new_snapshot = not snapshot_file.exists()
        try:
            write_text_atomic(snapshot_file, plan.snapshot_text, state_root=path.parent)
            write_text_atomic(path, plan.lock_text, state_root=path.parent)
        except BaseException:
            if new_snapshot:  # no snapshot file without the entry that names it
                with contextlib.suppress(OSError):
                    snapshot_file.unlink()
            for folder in made:
                with contextlib.suppress(OSError):
                    folder.rmdir()
            raise
    replaced = existing is not None and any(e.id == plan.entry.id for e in existing.entries)
    return Blessed(path=path, lock=plan.lock, entry=plan.entry, replaced=replaced)


def _roots(request: LockRequest, lock: Lock, root: Path, snapshot: Snapshot,
           wanted: tuple[Wanted, ...]) -> Lock:
    """The lock with its roots resolved: the requirements that apply to this interpreter;
    else the owner of the command or the project; else the whole environment."""
    if request.distributions or request.requirement_files:
        kept = applicable(wanted, marker_environment(snapshot))
        lock = dataclasses.replace(lock, requires=tuple(dict.fromkeys(
            (*lock.requires, *(w.root for w in kept)))))
        if not lock.distribution and not lock.requires:
            raise InputError(f"{', '.join(request.requirement_files)}: no requirement "
                             "applies to this interpreter (their markers exclude it all)")
        return lock
    if lock.distribution or lock.requires or lock.scope == SCOPE_ENVIRONMENT:
        return lock  # as the existing lock says
    # A plain `python train.py`: no console script, so the project's own dependencies, or
    # with no project either, everything installed.
    owner = script_owner(snapshot, lock.command) or _project_of(root)
    if owner is None:
        return dataclasses.replace(lock, scope=SCOPE_ENVIRONMENT)
    return dataclasses.replace(lock, distribution=owner[0], extras=lock.extras or owner[1])


def _plan(request: LockRequest, name: str, path: Path, root: Path, existing: Lock | None,
          snapshot: Snapshot, wanted: tuple[Wanted, ...]) -> _Plan:
    lock = _roots(request, _merged(request, name, existing, root), root, snapshot, wanted)
    forbidden = lock.forbidden_installed(snapshot)
    if forbidden:
        raise InputError(f"will not lock an environment with forbidden packages installed: "
                         f"{', '.join(forbidden)} (uninstall them, or change --forbid)")
    entry = build_entry(snapshot, lock, entry_id=request.entry_id, project_root=root)
    own = (path, path.parent / f"{name}.snapshots")  # the lock never pins itself
    lock = dataclasses.replace(lock, files=hash_files(lock, root, skip=own))
    _refuse_credentials(lock, entry)
    snap_rel = f"{name}.snapshots/{entry.id}.json"
    check_state_path(path, path.parent)  # both refused before either is written
    check_state_path(path.parent / snap_rel, path.parent)
    entry = dataclasses.replace(entry, snapshot_file=snap_rel)
    lock = lock.with_entry(entry)
    snapshot_text, lock_text = snapshot.to_json(), dump_lock(lock)
    _utf8(snapshot_text, lock_text)  # neither written unless both can be
    return _Plan(lock=lock, entry=entry, snapshot_rel=snap_rel, snapshot_text=snapshot_text,
                 lock_text=lock_text)


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
    fields += [("a required distribution", x) for x in lock.requires]
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
