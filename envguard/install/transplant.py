"""Apply a predicted change by moving into the environment the files the installer wrote into
the scratch copy, so that the installer runs once, not twice.

For ``uv pip``, the prediction (:mod:`.predict`) runs uv with the environment's own
interpreter and ``--prefix`` at the scratch copy: the copy then holds exactly the files uv
would write into the environment (scripts with the environment's interpreter in their
shebang, RECORD rows and all), and nothing else changed. :func:`transplant` makes the
environment that result:

1. what the installer did to the copy, from :func:`inventory` before it ran and after: a
   file that is new, or not the one the copy was made with, is the installer's; a
   ``*.dist-info`` folder whose RECORD it removed or replaced is a distribution it
   uninstalled;
2. each uninstalled distribution's files, as its RECORD in the environment lists them (with
   their ``__pycache__`` files and the metadata folder itself), are moved aside into the
   copy; a path outside the environment is never touched;
3. each file the installer wrote is renamed to its place in the environment (the copy is on
   the same filesystem); folders the environment lacks are made with the copy's modes; a
   file that is there already is moved aside first;
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
import os
import stat
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from envguard.errors import EnvguardError
from envguard.exitcodes import ExitCode
from envguard.frozen import frozen
from envguard.install.scratch import EnvironmentBusy, LinkGuard, exclusive, remove_later

FileKey = tuple[int, int, int, bool]
"""(inode, size, modification time in ns, is a symlink) of one entry of the copy."""
_META = (".dist-info", ".egg-info")
_UV_LOCK = ".lock"
_ASIDE = ".envguard-aside"
_LOCK_WAIT_S = 60.0


class TransplantFailed(EnvguardError):
    """The predicted files could not be moved into place; the environment is as it was."""

    exit_code = ExitCode.ENVIRONMENT_ERROR


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


@frozen
class Moved:
    """What :func:`transplant` did."""

    added: int
    """Files moved into the environment."""
    removed: int
    """Files of uninstalled distributions moved aside."""
    seconds: float


def inventory(folder: str) -> dict[str, FileKey]:
    """Every file and symlink under ``folder`` (symlinks not followed), by relative path."""
    out: dict[str, FileKey] = {}
    stack = [("", folder)]
    while stack:
        rel, path = stack.pop()
        with os.scandir(path) as entries:
            for entry in entries:
                sub = f"{rel}{entry.name}"
                if entry.is_dir(follow_symlinks=False):
                    stack.append((sub + "/", entry.path))
                    continue
                st = entry.stat(follow_symlinks=False)
                out[sub] = (st.st_ino, st.st_size, st.st_mtime_ns, entry.is_symlink())
    return out


def metadata_dirs(prefix: str, sites: tuple[str, ...]) -> frozenset[str]:
    """The metadata folders in ``sites`` (inside ``prefix``), relative to ``prefix``."""
    out = set()
    for site in sites:
        with contextlib.suppress(OSError), os.scandir(site) as entries:
            for entry in entries:
                if entry.name.endswith(_META) and entry.is_dir(follow_symlinks=False):
                    out.add(os.path.relpath(entry.path, prefix))
    return frozenset(out)


def _inside(prefix: str, path: str) -> bool:
    return path.startswith(prefix + os.sep)


def _key(path: str) -> FileKey | None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns, stat.S_ISLNK(st.st_mode))


def _touched(staged: Staged) -> set[str]:
    """The entries the copy was made with that the installer removed or replaced."""
    return {rel for rel, key in staged.before.items()
            if _key(os.path.join(staged.folder, rel)) != key}


def _removals(staged: Staged, touched: set[str]) -> dict[str, None]:
    """Absolute paths in the environment the installer's uninstalls remove (see the
    module), in order; the metadata folders of uninstalled distributions among them."""
    prefix = staged.prefix
    removed: dict[str, None] = {}
    for meta in sorted({rel.rsplit("/", 1)[0] for rel in touched if "/" in rel}):
        if not meta.endswith(_META) or (meta.endswith(".dist-info")
                                        and f"{meta}/RECORD" not in touched):
            continue  # a file of a distribution that stays (the installer rewrote it)
        if meta.endswith(".egg-info"):
            raise TransplantFailed(f"the installer removed {meta}, a legacy egg-info "
                                   "distribution whose files only the installer can list")
        for path in _record_paths(prefix, meta):
            removed[path] = None
        removed[os.path.join(prefix, meta)] = None
    for rel in touched:  # anything else the installer took out of the copy
        path = os.path.join(prefix, rel)
        if _key(os.path.join(staged.folder, rel)) is None and path not in removed:
            removed[path] = None
    return removed


def _whole_folders(removed: dict[str, None], sites: tuple[str, ...]) -> list[str]:
    """Folders right below a site-packages folder that hold nothing but removed files (and
    no empty folder): moved aside in one step each instead of file by file."""
    tops: dict[str, None] = {}
    for path in removed:
        for site in sites:
            if _inside(site, path):
                top = os.path.join(site, path[len(site) + 1:].split(os.sep, 1)[0])
                tops[top] = None
    whole = []
    for top in tops:
        if top in removed and top.endswith(_META):
            whole.append(top)
            continue
        if os.path.islink(top) or not os.path.isdir(top):
            continue
        if _only_removed(top, removed):
            whole.append(top)
    return whole


def _only_removed(top: str, removed: dict[str, None]) -> bool:
    """Whether every file below ``top`` is removed, with no link to a folder and no empty
    folder (an installer leaves a folder it does not empty)."""
    stack = [top]
    while stack:
        with os.scandir(stack.pop()) as entries:
            empty = True
            for entry in entries:
                empty = False
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
                elif entry.path not in removed:
                    return False
            if empty:
                return False
    return True


def _record_paths(prefix: str, meta: str) -> list[str]:
    """What uninstalling the distribution of ``meta`` removes from the environment: its
    RECORD's files inside ``prefix``, their ``__pycache__`` files, the metadata folder's."""
    from envguard.input_file import RECORD_BYTES, NotReadable, read_bounded_text
    from envguard.probe.recordfile import parse_record

    folder = os.path.join(prefix, meta)
    site = os.path.dirname(folder)
    try:
        rows = parse_record(read_bounded_text(os.path.join(folder, "RECORD"),
                                              limit=RECORD_BYTES, what="RECORD"))
    except (OSError, NotReadable) as exc:
        raise TransplantFailed(f"{meta}/RECORD cannot be read ({exc}): the files of the "
                               "distribution it replaces are unknown") from None
    out: list[str] = []
    caches: dict[str, list[str]] = {}
    for row in rows:
        path = os.path.normpath(os.path.join(site, row[0]))
        if not _inside(prefix, path):
            continue
        out.append(path)
        if path.endswith(".py"):
            cache = os.path.join(os.path.dirname(path), "__pycache__")
            if cache not in caches:
                try:
                    caches[cache] = os.listdir(cache)
                except OSError:
                    caches[cache] = []
            stem = os.path.basename(path)[:-3] + "."
            out += [os.path.join(cache, n) for n in caches[cache]
                    if n.startswith(stem) and n.endswith(".pyc")]
    for folder_path, _dirs, files in os.walk(folder):
        out += [os.path.join(folder_path, n) for n in files]
    return out


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
    try:
        import fcntl
    except ImportError:  # pragma: no cover - no flock (Windows)
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
        deadline = time.monotonic() + _LOCK_WAIT_S
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise EnvironmentBusy(f"uv holds {prefix}/.lock (another install into "
                                          "the environment); nothing was changed") from None
                time.sleep(0.05)
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
                if staged.before.get(sub) != _key(entry.path):
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
            if staged.before.get(sub) == _key(entry.path):
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
        removed = _removals(staged, _touched(staged))
        whole = _whole_folders(removed, staged.sites)
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
        for folder in sorted({os.path.dirname(p) for p in removed},
                             key=lambda p: -p.count(os.sep)):
            _remove_empty(folder, staged.prefix)  # as installers do; one still in use stays
    if echo is not None:
        for line in staged.lines:
            echo(line)
    return Moved(added=added, removed=gone, seconds=time.perf_counter() - started)


def _remove_empty(folder: str, prefix: str) -> None:
    """``folder`` and its parents, each while it is empty; never ``site-packages`` nor a
    folder right under ``prefix``."""
    while (_inside(prefix, folder) and os.path.dirname(folder) != prefix
           and os.path.basename(folder) != "site-packages"):
        try:
            os.rmdir(folder)
        except OSError:
            return
        folder = os.path.dirname(folder)


def discard(staged: Staged | None) -> None:
    """Remove the staged copy (and what a move set aside in it) in a process of its own
    (:func:`~.scratch.remove_later`)."""
    if staged is not None:
        remove_later(staged.folder, detached=True)
