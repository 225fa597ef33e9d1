"""The kernel of the RECORD check: stat a slice of one distribution's RECORD rows.

Plain data in and out (no :mod:`envguard.model`), so that :mod:`~envguard.probe.fastpath.statahead`
can run it in a child forked before the rest of envguard is imported, and send its answer
back with ``marshal``. :mod:`~envguard.probe.integrity` owns the modes, the hashing and the
records; this module only decides, row by row, what a ``stat`` says about a file.

What a row can be (see :mod:`~envguard.probe.integrity` for why):

- tolerated: neither a hash nor a size;
- ``outside-install-tree``: its path leaves the installation's prefix (never stat'ed);
- ``missing``, ``unreadable``;
- ``not-a-regular-file`` (a FIFO, a device, a folder);
- ``size``: the size differs from RECORD's;
- ``modified-after-install``: newer than RECORD itself (size mode), or queued for
  hashing (hash mode).

A file that differs (``size``, ``hash``, ``modified-after-install``) and has more than one
hard link has its link count kept in :attr:`Checked.links` (``st_nlink`` of the ``stat`` made:
no system call more); a job to hash carries it too. uv links installed files from its cache,
so an edit to such a file is an edit to every link (:mod:`~envguard.probe.hardlinks`).

Header folders, size mode: a file under a folder named ``include`` (C and C++ headers,
which the interpreter never loads; half of a CUDA torch venv's files) is vouched for by
its folder when that folder is not newer than RECORD: adding, removing, renaming or
replacing a file (as installers, ``patch``, ``sed -i`` and most editors do) changes the
folder's time, and then every file of the folder is stat'ed. An edit written into a
header in place is found by ``--verify hash``, which reads every file.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from envguard.probe.fastpath.marshal_file import Key, stat_key
from envguard.probe.recordfile import RecordRow

NOT_REGULAR = "not-a-regular-file"
OUTSIDE = "outside-install-tree"
HEADER_FOLDER = "include"
"""The name of the folders whose files :func:`check_rows` may vouch for by the folder."""
LOADED_SUFFIXES = (".py", ".pyc", ".pyd", ".so", ".pth", ".dll", ".dylib")
"""Files the interpreter loads: stat'ed one by one even in a header folder."""
MTIME_SLACK_NS = 2_000_000_000
"""A file may be this much newer than its RECORD (installers write RECORD last, but
filesystem timestamps are coarse)."""

Issue = tuple[str, str, str | None, str | None]
"""(path, problem, expected, actual)."""
Job = tuple[str, str, str, str, Key, int]
"""A file to hash: (RECORD path, full path, algorithm, expected digest, stat key, links)."""
Known = Callable[[str, Key, str], str | None]
"""The digest memoised for (full path, stat key, algorithm), if any."""

_SITE_LAYOUT = re.compile(r"(?P<prefix>.+?)[/\\](?:lib(?:32|64)?[/\\][^/\\]+|Lib)[/\\]"
                          r"(?:site|dist)-packages")

_is_absolute: Callable[[str], bool] = (
    (lambda rel: rel.startswith("/")) if os.sep == "/" and not os.altsep else os.path.isabs)
"""``os.path.isabs`` for RECORD paths; on POSIX a prefix test (a fifth of the gate's RECORD
check went into ``isabs`` for torch's 20,000 rows)."""


def install_tree(site_dir: str) -> str:
    """The folder every file of a distribution installed into ``site_dir`` lies in: the
    prefix above ``lib/pythonX.Y/site-packages`` (``lib64``, ``dist-packages``, Windows'
    ``Lib/site-packages``), else the folder above ``site_dir``."""
    site_dir = os.path.normpath(site_dir)
    match = _SITE_LAYOUT.fullmatch(site_dir)
    return match.group("prefix") if match else os.path.dirname(site_dir)


def file_kind(st_mode: int) -> str:
    """What a path that is not a regular file is, in words (``actual`` of the issue)."""
    for test, name in ((stat.S_ISFIFO, "FIFO"), (stat.S_ISCHR, "character device"),
                       (stat.S_ISBLK, "block device"), (stat.S_ISSOCK, "socket"),
                       (stat.S_ISDIR, "folder")):
        if test(st_mode):
            return name
    return "special file"


@dataclass(slots=True)
class Checked:
    """What :func:`check_rows` found in one slice of rows."""

    issues: list[Issue]
    jobs: list[Job]
    files: int = 0
    size: int = 0
    tolerated: int = 0
    by_folder: int = 0
    """Header files vouched for by their unchanged folder, not stat'ed (size mode)."""
    links: dict[str, int] = field(default_factory=dict)
    """RECORD path -> hard links, for the files of ``issues`` that have more than one."""


def header_folder(folder: str) -> bool:
    """Whether ``folder`` (a RECORD path's folder, ``/``-separated, relative) lies in a
    header tree: one of its parts is :data:`HEADER_FOLDER` and none is ``..``."""
    parts = folder.split("/")
    return HEADER_FOLDER in parts and ".." not in parts and not _is_absolute(folder)


def header_row(rel: str, row_hash: str, row_size: str) -> str | None:
    """The folder that may vouch for this RECORD row in size mode (a header file under a
    folder named ``include``; see the module), or None: the row is stat'ed on its own."""
    if not (row_hash or row_size) or "include/" not in rel or rel.endswith(LOADED_SUFFIXES):
        return None
    folder = rel[:rel.rfind("/")]
    return folder if header_folder(folder) else None


def vouched_by_folders(site_dir: str, summary: tuple[tuple[str, int], ...],
                       installed_ns: int) -> int | None:
    """The rows of ``summary`` ((folder, rows) of header rows only, as
    :func:`header_row` grouped them) if every folder is unchanged since ``installed_ns``,
    else None: then each row must be checked (:func:`check_rows`)."""
    base, newest_ns, rows = site_dir + os.sep, installed_ns + MTIME_SLACK_NS, 0
    for folder, count in summary:
        if not _unchanged_folder(base + folder, newest_ns):
            return None
        rows += count
    return rows


def check_rows(site_dir: str, rows: list[RecordRow], installed_ns: int | None, *,
               hashing: bool = False, known: Known | None = None) -> Checked:
    """Stat each row's file; in hash mode queue the ones ``known`` has no digest for
    (``installed_ns``: when RECORD was written, for the size mode's mtime test; in size
    mode a header folder no newer than that vouches for its files, see the module)."""
    out = Checked(issues=[], jobs=[])
    issues = out.issues
    base = site_dir + os.sep
    tree = install_tree(site_dir) + os.sep
    stat_path, is_regular = os.stat, stat.S_ISREG  # locals: this loop runs per file
    newest_ns = (installed_ns + MTIME_SLACK_NS if installed_ns is not None and not hashing
                 else None)
    last_folder: str | None = None
    vouched = False
    files = size_sum = tolerated = by_folder = 0
    for rel, row_hash, row_size in rows:
        if not row_hash and not row_size:
            tolerated += 1
            continue
        if newest_ns is not None and "include/" in rel:  # size mode; most rows fail the test
            folder = header_row(rel, row_hash, row_size)
            if folder is not None:
                if folder != last_folder:
                    last_folder = folder
                    vouched = _unchanged_folder(base + folder, newest_ns)
                if vouched:
                    by_folder += 1
                    continue
        if ".." in rel or _is_absolute(rel):
            full = os.path.normpath(os.path.join(site_dir, rel))
            if not full.startswith(tree):
                issues.append((rel, OUTSIDE, None, full))
                continue
        else:
            full = base + rel
        try:
            st = stat_path(full)
        except FileNotFoundError:
            issues.append((rel, "missing", None, None))
            continue
        except OSError as exc:
            issues.append((rel, "unreadable", None, exc.strerror))
            continue
        if not is_regular(st.st_mode):
            issues.append((rel, NOT_REGULAR, None, file_kind(st.st_mode)))
            continue
        size = st.st_size
        files += 1
        size_sum += size
        if row_size and row_size != str(size) and row_size.isdigit():
            issues.append((rel, "size", row_size, str(size)))
            if st.st_nlink > 1:
                out.links[rel] = st.st_nlink
            continue
        if hashing and row_hash:
            algorithm, _, expected = row_hash.partition("=")
            if algorithm not in hashlib.algorithms_available:
                tolerated += 1
                continue
            key = stat_key(st)
            digest = known(full, key, algorithm) if known is not None else None
            if digest is None:
                out.jobs.append((rel, full, algorithm, expected, key, st.st_nlink))
            elif digest != expected:
                issues.append((rel, "hash", expected, digest))
                if st.st_nlink > 1:
                    out.links[rel] = st.st_nlink
        elif newest_ns is not None and st.st_mtime_ns > newest_ns:
            issues.append((rel, "modified-after-install", None, None))
            if st.st_nlink > 1:
                out.links[rel] = st.st_nlink
    out.files, out.size, out.tolerated, out.by_folder = files, size_sum, tolerated, by_folder
    return out


def _unchanged_folder(path: str, newest_ns: int) -> bool:
    """Whether ``path`` is a folder whose time is not after ``newest_ns``."""
    try:
        st = os.stat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_mtime_ns <= newest_ns


def encode(checked: Checked) -> tuple[Any, ...]:
    """A size-mode result as ``marshal``-able data (a forked worker's answer)."""
    return (checked.issues, checked.files, checked.size, checked.tolerated, checked.by_folder,
            checked.links)


def decode(data: Any) -> Checked:
    """:func:`encode` back; raises ValueError for data of another shape (a worker that
    wrote garbage: its units are checked again)."""
    try:
        issues, files, size, tolerated, by_folder, links = data
        parsed = [(str(p), str(k), e, a) for p, k, e, a in issues]
        counts = {str(p): n for p, n in links.items()}
    except (AttributeError, TypeError, ValueError) as exc:
        raise ValueError(f"not a RECORD check result: {exc}") from None
    if not all(type(n) is int for n in (files, size, tolerated, by_folder, *counts.values())):
        raise ValueError("not a RECORD check result: counts are not integers")
    return Checked(issues=parsed, jobs=[], files=files, size=size, tolerated=tolerated,
                   by_folder=by_folder, links=counts)
