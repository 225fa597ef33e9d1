"""Apply a predicted change by moving into the environment the files the installer wrote into
the scratch copy, so that the installer runs once, not twice.

For ``uv pip``, the prediction (:mod:`.predict`) runs uv with the environment's own
interpreter and ``--prefix`` at the scratch copy: the copy then holds exactly the files uv
would write into the environment (scripts with the environment's interpreter in their
shebang, RECORD rows and all), and nothing else changed. :func:`transplant` makes the
environment that result:

1. what the installer did to the copy, from the copy's :func:`~.skeleton.inventory` taken before it
   ran: an entry that is new, or not the one the copy was made with, is the installer's;
   a ``*.dist-info`` folder whose RECORD it removed or replaced is a distribution it
   uninstalled;
2. each uninstalled distribution's files, as its RECORD in the environment lists them (with
   their ``__pycache__`` files and the metadata folder itself:
   :mod:`envguard.install.uninstalls`), are moved aside into the copy; a path outside the
   environment is never touched;
3. what the installer wrote is renamed to its place in the environment (the copy is on the
   same filesystem): a folder the environment lacks in one step, with its mode (a new
   package's whole tree), else entry by entry; a file that is there already is moved
   aside first;
4. folders the uninstall left empty are removed, as installers do.

Every move is journaled; when one fails the journal is played back, the environment is as it
was, and :class:`TransplantFailed` says why (``envguard install`` then runs the installer
itself). Before anything moves, the copy's shared metadata files must be unchanged in the
environment and no distribution may have appeared there since the copy was made (else the
prediction is stale: :class:`TransplantFailed` too). envguard's lock on the environment's
folder and uv's own (its ``.lock``) are held while files move.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import stat
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from envguard.flock import CAN_FLOCK, flock_until
from envguard.frozen import frozen
from envguard.install.scratch import EnvironmentBusy, LinkGuard, exclusive, keep_or_remove
from envguard.install.skeleton import FileKey, file_key
from envguard.install.uninstalls import (
    META,
    TransplantFailed,
    inside,
    removals,
    touched,
    whole_folders,
)

_UV_LOCK = ".lock"
_ASIDE = ".envguard-aside"
_LOCK_WAIT_S = 60.0


@frozen
class Staged:
    """A prediction's copy, kept so that its files can be moved into the environment."""

    folder: str
    """The copy (renamed to a name of this process's own)."""
    prefix: str
    """The environment's folder."""
    before: dict[str, FileKey]
    """:func:`inventory` of the copy as it was made, before the installer ran."""
    sites: tuple[str, ...]
    """The environment's site-packages folders."""
    metadata_dirs: frozenset[str]
    """Their ``*.dist-info`` and ``*.egg-info`` folders (relative to ``prefix``) when the
    copy was made."""
    guard: LinkGuard
    lines: tuple[str, ...] = ()
    """What the installer printed on the copy."""
    started_at: str = ""
    """When the installer began writing into the copy: the moved files' times are from
    then, so the change's revision starts then."""
    records: dict[str, tuple[int, int, int]] = dataclasses.field(default_factory=dict)
    """(inode, size, mtime) of each new RECORD the prediction read in the copy, by the path
    it moves to in the environment: one found there unchanged is that very file
    (:func:`envguard.install.apply.read_back`)."""


@frozen
class Moved:
    """What :func:`transplant` did."""

    added: int
    """Files moved into the environment."""
    removed: int
    """Files of uninstalled distributions moved aside."""
    seconds: float


def metadata_dirs(prefix: str, sites: tuple[str, ...]) -> frozenset[str]:
    """The metadata folders in ``sites`` (inside ``prefix``), relative to ``prefix``."""
    out = set()
    for site in sites:
        with contextlib.suppress(OSError), os.scandir(site) as entries:
            for entry in entries:
                if entry.name.endswith(META) and entry.is_dir(follow_symlinks=False):
                    out.add(os.path.relpath(entry.path, prefix))
    return frozenset(out)


def _check_fresh(staged: Staged) -> None:
    changed = staged.guard.changed()
    if changed:
        raise TransplantFailed(f"{changed[0]} changed since the prediction (another install?): "
                               "the prediction is stale")
    now = metadata_dirs(staged.prefix, staged.sites)
    new = sorted(now - staged.metadata_dirs)
    if new:
        raise TransplantFailed(f"{new[0]} appeared since the prediction (another install?): "
                               "the prediction is stale")


@contextlib.contextmanager
def _uv_lock(prefix: str) -> Iterator[None]:
    """uv's lock on the environment (``PREFIX/.lock``, when there is one), held while the
    block runs; a link or anything but a file there is not opened."""
    if not CAN_FLOCK:  # pragma: no cover - no flock (Windows)
        yield
        return
    try:
        fd = os.open(os.path.join(prefix, _UV_LOCK),
                     os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
                     | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        yield
        return
    try:
        if not flock_until(fd, time.monotonic() + _LOCK_WAIT_S):
            raise EnvironmentBusy(f"uv holds {prefix}/.lock (another install into the "
                                  "environment); nothing was changed")
        yield
    finally:
        os.close(fd)


class _Journal:
    """Moves and folders made, played back in reverse when a step fails."""

    def __init__(self, aside: str) -> None:
        self.aside = aside
        self.moves: list[tuple[str, str]] = []
        self.made: list[str] = []

    def move(self, src: str, dst: str) -> None:
        os.rename(src, dst)
        self.moves.append((src, dst))

    def set_aside(self, path: str) -> None:
        self.move(path, os.path.join(self.aside, str(len(self.moves))))

    def mkdir(self, path: str, mode: int) -> None:
        os.mkdir(path, mode)
        os.chmod(path, mode)  # as the copy had it, whatever the umask
        self.made.append(path)

    def play_back(self) -> list[str]:
        """Undo every step, newest first; the steps that could not be undone."""
        failed = []
        for src, dst in reversed(self.moves):
            try:
                os.rename(dst, src)
            except OSError as exc:
                failed.append(f"{src}: {exc.strerror}")
        for path in reversed(self.made):
            with contextlib.suppress(OSError):
                os.rmdir(path)
        return failed


def _aside_removals(journal: _Journal, removed: dict[str, None], whole: list[str]) -> int:
    """Move the uninstalled files aside: ``whole`` folders in one step each, the rest file
    by file; how many entries moved."""
    for top in whole:
        journal.set_aside(top)
    count = len(whole)
    inside = tuple(top + os.sep for top in whole)
    tops = set(whole)
    for path in removed:
        if path in tops or (inside and path.startswith(inside)):
            continue
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            continue  # listed twice (RECORD and the copy), or not there
        if stat.S_ISDIR(st.st_mode):
            continue  # a folder a RECORD names: its files are listed themselves
        journal.set_aside(path)
        count += 1
    return count


def _move_new(journal: _Journal, staged: Staged) -> int:
    """Move what the installer wrote into the copy to the same places in the environment:
    a folder the environment lacks in one step, else what is in it, entry by entry; the
    copy's own entries (unchanged since it was made) stay. How many entries moved."""
    count = 0
    stack = [""]
    while stack:
        rel = stack.pop()
        with os.scandir(os.path.join(staged.folder, rel)) as entries:
            items = list(entries)
        for entry in items:
            sub = f"{rel}{entry.name}"
            if sub in (_UV_LOCK, _ASIDE):
                continue
            real = os.path.join(staged.prefix, sub)
            if entry.name == "__pycache__" or entry.name.endswith(".pyc"):
                if staged.before.get(sub) != file_key(entry.path):
                    raise TransplantFailed(f"the installer compiled bytecode on the copy "
                                           f"({sub}), which names the copy's folder")
                continue
            there = os.path.lexists(real)
            if entry.is_dir(follow_symlinks=False):
                if not there:
                    if os.path.isdir(os.path.join(entry.path, "__pycache__")):
                        raise TransplantFailed(f"the installer compiled bytecode on the copy "
                                               f"({sub}/__pycache__), which names the copy's "
                                               "folder")
                    journal.move(entry.path, real)
                    count += 1
                elif os.path.islink(real) or not os.path.isdir(real):
                    what = "a link" if os.path.islink(real) else "not a folder"
                    raise TransplantFailed(f"{real} is {what}: the installer's files are not "
                                           "moved through it")
                else:
                    stack.append(sub + "/")
                continue
            if staged.before.get(sub) == file_key(entry.path):
                continue  # the copy's own, untouched
            if there:
                if os.path.isdir(real) and not os.path.islink(real):
                    raise TransplantFailed(f"{real} is a folder where the installer wrote a "
                                           "file")
                journal.set_aside(real)
            journal.move(entry.path, real)
            count += 1
    return count


def transplant(staged: Staged, *, echo: Callable[[str], None] | None = None) -> Moved:
    """Make the environment what the installer made of the copy (see the module)."""
    started = time.perf_counter()
    with exclusive(Path(staged.prefix)), _uv_lock(staged.prefix):
        _check_fresh(staged)
        removed = removals(staged.prefix, staged.folder, touched(staged.folder, staged.before))
        whole = whole_folders(removed, staged.sites)
        aside = os.path.join(staged.folder, _ASIDE)
        os.mkdir(aside, 0o700)
        journal = _Journal(aside)
        try:
            gone = _aside_removals(journal, removed, whole)
            added = _move_new(journal, staged)
        except BaseException as exc:
            failed = journal.play_back()
            if failed:
                raise TransplantFailed(f"moving the installer's files failed ({exc}) and "
                                       f"{len(failed)} could not be put back, first "
                                       f"{failed[0]}; envguard undo returns to the state "
                                       "before") from None
            if isinstance(exc, OSError):
                raise TransplantFailed(f"moving the installer's files failed: {exc}; the "
                                       "environment is as it was") from None
            raise
        moved_whole = tuple(top + os.sep for top in whole)
        for folder in sorted({p.rpartition(os.sep)[0] for p in removed
                              if not p.startswith(moved_whole)},
                             key=lambda p: -p.count(os.sep)):
            _remove_empty(folder, staged.prefix)  # as installers do; one still in use stays
    if echo is not None:
        for line in staged.lines:
            echo(line)
    return Moved(added=added, removed=gone, seconds=time.perf_counter() - started)


def _remove_empty(folder: str, prefix: str) -> None:
    """``folder`` and its parents, each while it is empty; never ``site-packages`` nor a
    folder right under ``prefix``."""
    while (inside(prefix, folder) and os.path.dirname(folder) != prefix
           and os.path.basename(folder) != "site-packages"):
        try:
            os.rmdir(folder)
        except OSError:
            return
        folder = os.path.dirname(folder)


def discard(staged: Staged | None) -> None:
    """Done with the staged copy: kept as the next prediction's copy, what the installer
    wrote and what a move set aside in it removed in a process of its own
    (:func:`~.scratch.keep_or_remove`)."""
    if staged is not None:
        keep_or_remove(Path(staged.folder), Path(staged.prefix), staged.before)
