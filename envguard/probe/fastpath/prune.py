"""Memo files no run has used for MAX_IDLE_S are removed, so the memo folder does not
grow one file per environment (or GPU state, or dependency closure) forever.

A file's last use is the later of its modification and access times: a write refreshes
the first, a read the second where the file system keeps access times (``relatime``, the
Linux default, updates it at most once a day, which is all a bound in weeks needs). Under
``noatime`` the bound is by last write: a memo still read but not rewritten for that long
is removed, and the next run only pays once to write it again.

Pruning runs where memo files are written, at most once a day per memo folder: a stamp
file (``.prune-stamp``) holds the time of the last one, so the usual cost is one ``lstat``.
Only this user's regular files named as envguard names its memo files are removed;
nothing is followed (a link, a folder or a foreign file there is left alone).
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
import time
from pathlib import Path

__all__ = ["MAX_IDLE_S", "MEMO_NAME", "PERIOD_S", "STAMP", "prune"]

MAX_IDLE_S = 30 * 86400
"""A memo file unused for longer than this (30 days) is removed."""
PERIOD_S = 86400
"""At most one pruning a day per memo folder."""
STAMP = ".prune-stamp"
MEMO_NAME = re.compile(
    r"(?:(?:records|hashes|interpreter)-[0-9a-f]{16}\.marshal"
    r"|gpu-[0-9a-f]{16}\.json|closure-[0-9a-f]{24}\.json)")
"""The names envguard gives its memo files (records, hashes, interpreter facts, GPU facts,
dependency closures)."""
_OPEN_DIR = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0) \
    | getattr(os, "O_NOFOLLOW", 0)
_OPEN_STAMP = os.O_WRONLY | os.O_CREAT | getattr(os, "O_CLOEXEC", 0) \
    | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
_DONE: set[str] = set()


def prune(folder: Path, *, now: float | None = None, max_idle_s: float = MAX_IDLE_S,
          period_s: float = PERIOD_S) -> list[str]:
    """Remove the memo files of ``folder`` (a folder the caller trusts:
    :func:`envguard.paths.private_folder`) unused for ``max_idle_s``, if the last pruning
    there is older than ``period_s``; the names removed. Never raises: a memo folder that
    cannot be pruned only keeps its files."""
    key = os.path.abspath(folder)
    if key in _DONE:
        return []
    _DONE.add(key)
    now = time.time() if now is None else now
    try:
        last = os.lstat(os.path.join(key, STAMP)).st_mtime
    except OSError:
        last = None
    if last is not None and 0 <= now - last < period_s:
        return []  # pruned within the period (a stamp in the future counts as stale)
    try:
        fd = os.open(key, _OPEN_DIR)
    except OSError:
        return []
    try:
        if not _claim(fd, now):
            return []
        return _remove_idle(fd, now - max_idle_s)
    finally:
        os.close(fd)


def _claim(folder: int, now: float) -> bool:
    """Set the stamp to ``now``; False if it is not this user's regular file."""
    try:
        fd = os.open(STAMP, _OPEN_STAMP, 0o600, dir_fd=folder)
    except OSError:
        return False  # a link, a folder, another user's file: no pruning
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            return False
        os.utime(fd, (now, now))
    except OSError:
        return False
    finally:
        os.close(fd)
    return True


def _remove_idle(folder: int, cutoff: float) -> list[str]:
    try:
        with os.scandir(folder) as entries:
            names = [e.name for e in entries if MEMO_NAME.fullmatch(e.name)]
    except OSError:
        return []
    removed = []
    for name in sorted(names):
        with contextlib.suppress(OSError):
            st = os.stat(name, dir_fd=folder, follow_symlinks=False)
            if stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid() \
                    and max(st.st_mtime, st.st_atime) < cutoff:
                os.unlink(name, dir_fd=folder)
                removed.append(name)
    return removed
