"""A scratch copy of an environment, cheap enough to make before every change.

Two kinds, both in the sibling folder ``.NAME.envguard-scratch`` (the same filesystem, so
hard links work). The name is the same every time, because uv remembers what it learned of
an interpreter by its path: a new path made every prediction pay uv's interpreter query
again (0.2-0.3 s of a 0.04 s install on the 2-core VM). One process at a time may hold it:
:func:`scratch_copy` takes an exclusive ``flock`` on the environment's folder
(:class:`EnvironmentBusy` when another envguard holds it), and renames its copy to
``.NAME.envguard-scratch-<pid>`` before letting go, so the removal that goes on in a
thread never meets the next process's copy.

:func:`metadata_clone`, tried first: the venv as an installer sees it (the interpreter,
every ``*.dist-info`` folder, ``.pth`` files and what they import, torch's ``version.py``,
pip's own package for pip), without the packages' files; tens of links per package
instead of thousands, symbolic ones: a hard link changes the file's inode change time,
which is part of every memo key of envguard's snapshot, so each prediction left the
venv's whole memo cold. :func:`clone_tree`, when a command fails there
(a build that imports the venv's packages): the whole venv, folders made anew, symlinks
copied as links (one that leads into the environment is pointed at the copy's own
folder), ``bin/`` scripts, ``pyvenv.cfg``, ``.pth`` files and every ``*.dist-info``
folder's files copied, ``__pycache__`` left out, every other file hard linked (copied
where a link cannot be made).

An installer run against the copy's interpreter changes the copy only: pip and uv replace
a file by unlinking or renaming it, never by writing into it (the tests prove it for both,
for installs over another package's file, upgrades, ``--force-reinstall`` and
uninstalls). :class:`LinkGuard` checks that anyway: every linked file keeps its size and
modification time in the real environment, or the prediction stops with an error that
says which file changed.

The copy is removed when the ``with`` block ends: at once when it ends with an exception
(Ctrl-C included), else in a thread while the command goes on
(:func:`wait_for_removals` waits for it), unless :func:`stage_away` kept it for the move of
its files into the environment (:mod:`envguard.install.transplant`); a copy a killed
envguard left behind is removed by the next one (the lock is free, or the pid in its name
is gone).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

from envguard.errors import EnvguardError
from envguard.exitcodes import ExitCode
from envguard.install.skeleton import (
    Cloned,
    FileKey,
    clone_plan,
    is_metadata,
    link_target,
    prune,
    realize,
)

_SCRATCH = ".envguard-scratch-"


class EnvironmentBusy(EnvguardError):
    """Another envguard process is predicting a change to the same environment."""

    exit_code = ExitCode.ENVIRONMENT_ERROR


class SharedFileChanged(EnvguardError):
    """An installer wrote into a file the scratch copy shares with the environment."""

    exit_code = ExitCode.ENVIRONMENT_ERROR


class LinkGuard:
    """The (size, mtime) of every file linked into the copy, by its real path."""

    def __init__(self) -> None:
        self.keys: dict[str, tuple[int, int]] = {}

    def add(self, path: str, st: os.stat_result) -> None:
        self.keys[path] = (st.st_size, st.st_mtime_ns)

    def changed(self) -> list[str]:
        """Real files whose size or modification time changed since they were linked."""
        out = []
        for path, key in self.keys.items():
            try:
                st = os.stat(path, follow_symlinks=False)
            except OSError:
                out.append(path)
                continue
            if (st.st_size, st.st_mtime_ns) != key:
                out.append(path)
        return out


def scratch_path(prefix: Path) -> Path:
    """The copy's folder while it is in use: the same name every time (see the module)."""
    return prefix.with_name(f".{prefix.name}{_SCRATCH[:-1]}")


def _trash_path(prefix: Path) -> Path:
    """A new folder name of this process's own (``.NAME.envguard-scratch-PID-tN``) for what
    is to be removed: the next envguard removes it if this one is killed first."""
    _STAGED[0] += 1
    return prefix.with_name(f".{prefix.name}{_SCRATCH}{os.getpid()}-t{_STAGED[0]}")


@contextlib.contextmanager
def exclusive(prefix: Path) -> Iterator[None]:
    """An exclusive ``flock`` on the environment's folder, held while the block runs."""
    try:
        import fcntl
    except ImportError:  # no flock (Windows): one envguard at a time is the user's to keep
        yield
        return
    fd = os.open(prefix, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise EnvironmentBusy(f"another envguard process is changing {prefix} (its "
                                  "install or undo holds the environment); try again when "
                                  "it is done") from None
        yield
    finally:
        os.close(fd)  # closing the descriptor lets go of the lock


def sweep_stale(prefix: Path) -> None:
    """Remove scratch copies of ``prefix`` whose envguard process is gone."""
    head = f".{prefix.name}{_SCRATCH}"
    with contextlib.suppress(OSError):
        for entry in os.scandir(prefix.parent):
            if not entry.name.startswith(head) or not entry.is_dir(follow_symlinks=False):
                continue
            pid = entry.name[len(head):].split("-", 1)[0]  # PID, or PID-N (a staged copy)
            if pid.isdigit() and not _alive(int(pid)):
                shutil.rmtree(entry.path, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def clone_tree(src: Path, dst: Path, guard: LinkGuard, *,
               link_metadata: bool = False) -> Cloned:
    """Copy ``src`` into the new folder ``dst`` as the module says (``link_metadata``:
    the files :func:`~.skeleton.is_metadata` names are linked too)."""
    linked = copied = copied_bytes = 0
    real_src = os.path.realpath(src)
    os.mkdir(dst, 0o755)
    for folder, dirs, files in os.walk(src):
        rel = os.path.relpath(folder, src)
        parts = () if rel == "." else tuple(Path(rel).parts)
        out = dst.joinpath(*parts)
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for name in [*dirs, *files]:
            path = os.path.join(folder, name)
            target = os.path.join(out, name)
            st = os.lstat(path)
            if os.path.islink(path):
                os.symlink(link_target(path, real_src, str(dst)), target)
                if name in dirs:
                    dirs.remove(name)  # not walked: a link, copied as one
                continue
            if name in dirs:
                os.mkdir(target, st.st_mode & 0o7777 | 0o700)
                continue
            if link_metadata or not is_metadata(parts, name):
                try:
                    os.link(path, target, follow_symlinks=False)
                except OSError:
                    pass
                else:
                    guard.add(path, st)
                    linked += 1
                    continue
            shutil.copy2(path, target, follow_symlinks=False)
            copied += 1
            copied_bytes += st.st_size
    return Cloned(linked=linked, copied=copied, copied_bytes=copied_bytes)


def metadata_clone(prefix: Path, dst: Path, site_packages: Sequence[str], guard: LinkGuard,
                   *, with_pip: bool) -> Cloned:
    """The venv as an installer sees it, without the packages' files: ``pyvenv.cfg``, the
    interpreter in ``bin/``, and in each site-packages folder every ``*.dist-info`` and
    ``*.egg-info`` folder, ``.pth`` and ``.egg-link`` file, the modules a ``.pth``
    file imports and torch's ``version.py`` (what the snapshot reads of torch), and for
    pip, pip's own package (symbolic links to the venv's files; the interpreter hard
    linked or copied). Resolution reads only the metadata, and an uninstall
    skips files that are not there, so the installer's choice is the same as on the venv;
    the files it writes are the new builds' own. A copy already at ``dst`` (kept from the
    last prediction) is brought up to date (:mod:`envguard.install.skeleton`)."""
    return realize(clone_plan(prefix, dst, site_packages, with_pip=with_pip), dst, guard)


@contextlib.contextmanager
def scratch_copy(prefix: Path, *, site_packages: Sequence[str] | None = None,
                 with_pip: bool = False) -> Iterator[tuple[Path, LinkGuard, Cloned]]:
    """A scratch copy of the venv at ``prefix``: (its folder, the guard, what it cost).
    With ``site_packages`` (the interpreter's folders): :func:`metadata_clone`, kept when
    the block ends (what the installer wrote moved aside and removed in a thread) and
    brought up to date by the next prediction; else the whole venv (:func:`clone_tree`),
    removed when the block ends."""
    wait_for_removals(detached=False)
    sweep_stale(prefix)
    folder = scratch_path(prefix)
    with exclusive(prefix):
        if os.path.islink(folder) or (os.path.lexists(folder) and not os.path.isdir(folder)):
            os.unlink(folder)  # planted, or not a folder: removed, never followed
        elif os.path.lexists(folder) and site_packages is None:
            shutil.rmtree(folder, ignore_errors=True)  # a kept copy: not a whole one
        guard = LinkGuard()
        try:
            cloned = (clone_tree(prefix, folder, guard) if site_packages is None else
                      metadata_clone(prefix, folder, site_packages, guard, with_pip=with_pip))
            yield folder, guard, cloned
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        # Removing thousands of files costs a second on a slow disk: done in a thread
        # while the command goes on (the real install), under a name of this process's
        # own; wait_for_removals() before the process ends.
        if not os.path.lexists(folder):
            return  # kept (stage_away)
        trash = _trash_path(prefix)
        try:
            if site_packages is not None:
                if not prune(folder, cloned.made, trash):
                    return
            else:
                os.rename(folder, trash)
        except OSError:
            shutil.rmtree(folder, ignore_errors=True)
            return
    remove_later(trash)


def keep_or_remove(staged: Path, prefix: Path, made: dict[str, FileKey]) -> None:
    """A copy kept past its block (:func:`stage_away`), once done with: kept as the next
    prediction's copy when none is there and no other envguard holds the environment, what
    it was not ``made`` with (:func:`~.skeleton.prune`) moved aside first; else removed.
    Either way what is moved aside goes in a process of its own (:func:`remove_later`)."""
    trash = _trash_path(prefix)
    try:
        with exclusive(prefix):
            if os.path.lexists(scratch_path(prefix)):
                raise EnvironmentBusy("a copy is there already")
            moved = prune(staged, made, trash)
            os.rename(staged, scratch_path(prefix))
    except (OSError, EnvironmentBusy):
        remove_later(staged, detached=True)
        if os.path.lexists(trash):
            remove_later(trash, detached=True)
        return
    if moved:
        remove_later(trash, detached=True)


_REMOVALS: list[threading.Thread] = []
_DETACHED: list[subprocess.Popen[bytes]] = []
_STAGED = [0]
_RMTREE = "import shutil, sys; shutil.rmtree(sys.argv[1], ignore_errors=True)"


def remove_later(folder: str | Path, *, detached: bool = False) -> None:
    """Remove ``folder`` in a thread, or (``detached``) in a process of its own that
    outlives envguard: the files a move set aside (torch's thousands) need not hold up the
    command's exit. :func:`wait_for_removals` waits for either; a folder a removal left
    behind is removed by the next envguard (its name holds a pid that is gone)."""
    if detached:
        try:
            _DETACHED.append(subprocess.Popen(
                [sys.executable, "-I", "-S", "-c", _RMTREE, str(folder)],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                start_new_session=True, close_fds=True))
            return
        except OSError:
            pass  # no process to be had: a thread instead
    thread = threading.Thread(target=shutil.rmtree, args=(folder,),
                              kwargs={"ignore_errors": True}, daemon=True)
    thread.start()
    _REMOVALS.append(thread)


def stage_away(folder: Path, prefix: Path) -> Path:
    """Keep the copy at ``folder`` past its ``with`` block: renamed to a name of this
    process's own (``.NAME.envguard-scratch-PID-N``, removed by the next envguard if this
    one is killed), which :func:`scratch_copy` then leaves alone."""
    _STAGED[0] += 1
    kept = prefix.with_name(f".{prefix.name}{_SCRATCH}{os.getpid()}-{_STAGED[0]}")
    os.rename(folder, kept)
    return kept


def wait_for_removals(*, detached: bool = True) -> None:
    """Wait until every scratch copy this process made is removed (``detached=False``:
    those removed in threads only; a detached removal goes on after envguard ends)."""
    while _REMOVALS:
        _REMOVALS.pop().join()
    while detached and _DETACHED:
        _DETACHED.pop().wait()


def check_guard(guard: LinkGuard) -> None:
    """SharedFileChanged naming the first files an installer wrote into through a link."""
    changed = guard.changed()
    if changed:
        shown = ", ".join(changed[:3]) + (f" and {len(changed) - 3} more" if len(changed) > 3
                                          else "")
        raise SharedFileChanged(f"the installer wrote into files the scratch copy shares with "
                                f"the environment: {shown}; envguard stopped before running "
                                "the command itself (report it: the installer writes in place)")
