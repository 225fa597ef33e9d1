"""Do the installed files still match their RECORD?

``size`` (the default) stats every recorded file: missing files, changed sizes,
and files whose mtime is newer than the install (an edit that kept the size).
``hash`` also compares content digests, in parallel threads (hashlib releases
the GIL), with results memoised in :class:`~envguard.probe.memo.hashes.HashMemo`.

Tolerated RECORD quirks, never reported as tampering: script rows (installers
rewrite shebangs), rows with neither hash nor size, ``__pycache__``/``.pyc``.

Only regular files are read. A RECORD path is relative to the site-packages folder it was
installed into; scripts, headers and data files leave it with ``..`` (``../../../bin/x``)
but stay inside the installation's prefix, the folder above ``lib/pythonX.Y/site-packages``
(:func:`install_tree`). A row whose path leaves that prefix (``../../../../../dev/zero``, an
absolute ``/dev/zero``) is reported as ``outside-install-tree`` and never opened; one that
is not a regular file once symlinks are followed (a FIFO, ``/dev/zero`` through a symlink,
a folder) as ``not-a-regular-file``, and never read: either would hang the hash or never
end. A symlink to a regular file elsewhere is checked like the file (installers make them:
``uv --link-mode symlink``).
"""

from __future__ import annotations

import base64
import functools
import hashlib
import os
import re
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from envguard.frozen import frozen
from envguard.model import Integrity, IntegrityIssue
from envguard.probe.background import Forked, fork_is_safe, parallel_map, usable_cpus
from envguard.probe.distributions import InstalledDist
from envguard.probe.memo.hashes import HashMemo
from envguard.probe.memo.marshal_file import Key, stat_key
from envguard.probe.progress import NullProgress, Progress

MODES = ("none", "size", "hash")
_MTIME_SLACK_NS = 2_000_000_000
_READ_CHUNK = 1 << 20
_BATCH_BYTES = 64 << 20
_MAX_ISSUES_PER_PACKAGE = 200
NOT_REGULAR = "not-a-regular-file"
OUTSIDE = "outside-install-tree"
_SITE_LAYOUT = re.compile(r"(?P<prefix>.+?)[/\\](?:lib(?:32|64)?[/\\][^/\\]+|Lib)[/\\]"
                          r"(?:site|dist)-packages")


@frozen(kw_only=False)
class _HashJob:
    package: str
    rel: str
    full: str
    algorithm: str
    expected: str
    key: Key


def record_digest(digest: bytes) -> str:
    """A digest as RECORD writes it: urlsafe base64 without padding."""
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


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


class _NotRegular(OSError):
    pass


def hash_file(path: str, algorithm: str) -> str:
    """RECORD-style digest of a file: urlsafe base64 without padding. Only a regular file
    is read (checked on the open descriptor, so a FIFO swapped in meanwhile never blocks)."""
    h = hashlib.new(algorithm)
    buf = bytearray(_READ_CHUNK)
    view = memoryview(buf)
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise _NotRegular(f"{path} is a {file_kind(mode)}")
    with open(fd, "rb", buffering=0) as fh:
        while True:
            n = fh.readinto(buf)
            if not n:
                break
            h.update(view[:n])
    return record_digest(h.digest())


def _hash_batch(jobs: list[_HashJob]) -> list[tuple[_HashJob, str | None, str | None]]:
    out: list[tuple[_HashJob, str | None, str | None]] = []
    for job in jobs:
        try:
            out.append((job, hash_file(job.full, job.algorithm), None))
        except _NotRegular:
            out.append((job, None, NOT_REGULAR))
        except OSError as exc:
            out.append((job, None, exc.strerror or str(exc)))
    return out


def _batches(jobs: list[_HashJob]) -> Iterator[list[_HashJob]]:
    batch: list[_HashJob] = []
    size = 0
    for job in jobs:
        batch.append(job)
        size += job.key[0]
        if size >= _BATCH_BYTES or len(batch) >= 512:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


@dataclass(slots=True)
class _DistResult:
    issues: list[IntegrityIssue]
    jobs: list[_HashJob]
    checked_files: int = 0
    checked_bytes: int = 0
    tolerated: int = 0


_CHUNK_ROWS = 2048

_is_absolute: Callable[[str], bool] = (
    (lambda rel: rel.startswith("/")) if os.sep == "/" and not os.altsep else os.path.isabs)
"""``os.path.isabs`` for RECORD paths; on POSIX a prefix test (a fifth of the gate's RECORD
check went into ``isabs`` for torch's 20,000 rows)."""


def _check_rows(
    item: InstalledDist,
    rows: list[tuple[str, str, str]],
    installed_ns: int | None,
    hashing: bool,
    memo: HashMemo | None,
) -> _DistResult:
    """Stat (and queue for hashing) a slice of one distribution's fingerprinted RECORD rows."""
    name = item.dist.name
    out = _DistResult(issues=[], jobs=[])
    issues = out.issues
    base = item.site_dir + os.sep
    tree = install_tree(item.site_dir) + os.sep
    stat_path, is_regular = os.stat, stat.S_ISREG  # locals: this loop runs per file
    newest_ns = (installed_ns + _MTIME_SLACK_NS if installed_ns is not None and not hashing
                 else None)
    files = size_sum = tolerated = 0
    for rel, row_hash, row_size in rows:
        if not row_hash and not row_size:
            tolerated += 1
            continue
        if ".." in rel or _is_absolute(rel):
            full = os.path.normpath(os.path.join(item.site_dir, rel))
            if not full.startswith(tree):
                issues.append(IntegrityIssue(package=name, path=rel, problem=OUTSIDE,
                                             actual=full))
                continue
        else:
            full = base + rel
        try:
            st = stat_path(full)
        except FileNotFoundError:
            issues.append(IntegrityIssue(package=name, path=rel, problem="missing"))
            continue
        except OSError as exc:
            issues.append(IntegrityIssue(package=name, path=rel, problem="unreadable",
                                         actual=exc.strerror))
            continue
        if not is_regular(st.st_mode):
            issues.append(IntegrityIssue(package=name, path=rel, problem=NOT_REGULAR,
                                         actual=file_kind(st.st_mode)))
            continue
        size = st.st_size
        files += 1
        size_sum += size
        if row_size and row_size != str(size) and row_size.isdigit():
            issues.append(IntegrityIssue(package=name, path=rel, problem="size",
                                         expected=row_size, actual=str(size)))
            continue
        if hashing and row_hash:
            algorithm, _, expected = row_hash.partition("=")
            if algorithm not in hashlib.algorithms_available:
                tolerated += 1
                continue
            key = stat_key(st)
            known = memo.get(full, key, algorithm) if memo else None
            if known is None:
                out.jobs.append(_HashJob(name, rel, full, algorithm, expected, key))
            elif known != expected:
                issues.append(IntegrityIssue(package=name, path=rel, problem="hash",
                                             expected=expected, actual=known))
        elif newest_ns is not None and st.st_mtime_ns > newest_ns:
            issues.append(IntegrityIssue(package=name, path=rel,
                                         problem="modified-after-install"))
    out.checked_files, out.checked_bytes, out.tolerated = files, size_sum, tolerated
    return out


def _work_units(
    installed: list[InstalledDist],
) -> list[tuple[InstalledDist, list[tuple[str, str, str]], int | None]]:
    """(distribution, slice of rows, install time) units of at most _CHUNK_ROWS rows."""
    units = []
    for item in installed:
        rows = item.record or []
        installed_ns = item.record_mtime_ns
        for start in range(0, max(len(rows), 1), _CHUNK_ROWS):
            units.append((item, rows[start:start + _CHUNK_ROWS], installed_ns))
    return units


def default_workers() -> int:
    """Threads for hashing (hashlib releases the GIL for large buffers)."""
    return max(2, min(16, os.cpu_count() or 2))


Unit = tuple[InstalledDist, list[tuple[str, str, str]], int | None]
_FORK_MIN_ROWS = 5000
"""Rows per forked child below which a fork costs more than it saves."""
_MAX_CHILDREN = 7


def _encode(result: _DistResult) -> tuple[Any, ...]:
    """A size-mode result as marshal-able data (a forked child's answer)."""
    return ([(i.package, i.path, i.problem, i.expected, i.actual) for i in result.issues],
            result.checked_files, result.checked_bytes, result.tolerated)


def _decode(data: tuple[Any, ...]) -> _DistResult:
    issues, files, size, tolerated = data
    return _DistResult(issues=[IntegrityIssue(package=p, path=f, problem=k, expected=e, actual=a)
                               for p, f, k, e, a in issues],
                       jobs=[], checked_files=files, checked_bytes=size, tolerated=tolerated)


def _child_work(group: list[Unit]) -> list[tuple[Any, ...]]:
    return [_encode(_check_rows(u[0], u[1], u[2], False, None)) for u in group]


@dataclass(slots=True)
class PendingCheck:
    """A RECORD check under way (:func:`begin`); :meth:`finish` completes it.

    In ``size`` mode with enough files, :func:`begin` forks children that stat the later
    shares of the files at once, while this process goes on (the collector starts its
    external commands meanwhile) and then stats the first share in :meth:`finish`. Threads
    cannot do this: measured on the 16-core H200 host, 48,706 stats took 0.115 s serially
    and 0.33 s spread over 4-16 threads (the per-row Python work serialises on the GIL).
    Hashing is the part that parallelises in threads (``workers``).
    """

    installed: list[InstalledDist]
    mode: str
    memo: HashMemo | None
    workers: int
    own: list[Unit]
    forked: list[tuple[list[Unit], Forked]]

    def finish(self, progress: Progress | None = None) -> Integrity:
        if self.mode == "none":
            return Integrity(mode="none")
        try:
            return self._finish(progress or NullProgress())
        except BaseException:
            for _, child in self.forked:
                child.abandon()
            raise

    def _finish(self, progress: Progress) -> Integrity:
        hashing = self.mode == "hash"
        memo = self.memo
        results = [_check_rows(u[0], u[1], u[2], hashing, memo) for u in self.own]
        for group, child in self.forked:
            answer = child.result()
            if isinstance(answer, list) and len(answer) == len(group):
                results.extend(_decode(data) for data in answer)
            else:  # the child failed: do its share here
                results.extend(_check_rows(u[0], u[1], u[2], hashing, memo) for u in group)
        with_record = [i for i in self.installed if i.record is not None]
        without_record = sorted(
            i.dist.name for i in self.installed
            if i.record is None and not i.dist.metadata_dir.endswith(".egg-info")
        )
        skipped = sum(i.record_total - len(i.record or ()) for i in with_record)
        issues = [x for r in results for x in r.issues]
        jobs = [j for r in results for j in r.jobs]
        hashed_bytes = _hash_jobs(jobs, memo, self.workers, progress, issues) if jobs else 0
        issues.sort(key=lambda i: (i.package, i.path, i.problem))
        return Integrity(
            mode=self.mode,
            checked_files=sum(r.checked_files for r in results),
            checked_bytes=sum(r.checked_bytes for r in results),
            hashed_bytes=hashed_bytes,
            tolerated=skipped + sum(r.tolerated for r in results),
            issues=_cap_per_package(issues),
            without_record=without_record,
        )


def _hash_jobs(jobs: list[_HashJob], memo: HashMemo | None, workers: int, progress: Progress,
               issues: list[IntegrityIssue]) -> int:
    """Hash the queued files in ``workers`` threads, adding what differs to ``issues``;
    returns the bytes hashed."""
    hashed_bytes = 0
    progress.start("hashing installed files", sum(j.key[0] for j in jobs))
    for batch in parallel_map(_hash_batch, _batches(jobs), workers):
        for job, digest, error in batch:
            progress.advance(job.key[0])
            if digest is None:
                problem = NOT_REGULAR if error == NOT_REGULAR else "unreadable"
                issues.append(IntegrityIssue(package=job.package, path=job.rel, problem=problem,
                                             actual=None if problem == NOT_REGULAR else error))
                continue
            hashed_bytes += job.key[0]
            if memo is not None:
                memo.put(job.full, job.key, job.algorithm, digest)
            if digest != job.expected:
                issues.append(IntegrityIssue(package=job.package, path=job.rel, problem="hash",
                                             expected=job.expected, actual=digest))
    progress.finish()
    return hashed_bytes


def begin(installed: list[InstalledDist], mode: str, *, memo: HashMemo | None = None,
          workers: int | None = None) -> PendingCheck:
    """Start checking every distribution's files against its RECORD (see
    :class:`PendingCheck`); raises ValueError for an unknown mode."""
    if mode not in MODES:
        raise ValueError(f"unknown verify mode {mode!r}")
    units = _work_units([i for i in installed if i.record is not None]) if mode != "none" else []
    pending = PendingCheck(installed=installed, mode=mode, memo=memo,
                           workers=workers or default_workers(), own=units, forked=[])
    rows = sum(len(u[1]) for u in units)
    children = (min(usable_cpus() - 1, _MAX_CHILDREN, rows // _FORK_MIN_ROWS - 1)
                if mode == "size" and rows >= 2 * _FORK_MIN_ROWS and fork_is_safe() else 0)
    if children <= 0:
        return pending
    share = rows // (children + 1)
    groups: list[list[Unit]] = [[] for _ in range(children + 1)]
    taken = 0
    for unit in units:
        groups[min(taken // share, children)].append(unit)
        taken += len(unit[1])
    pending.own = groups[0]
    for group in groups[1:]:
        if not group:
            continue
        try:
            pending.forked.append((group, Forked(functools.partial(_child_work, group))))
        except OSError:  # no fork (a process limit): this process does the share
            pending.own.extend(group)
    return pending


def verify(
    installed: list[InstalledDist],
    mode: str,
    *,
    memo: HashMemo | None = None,
    progress: Progress | None = None,
    workers: int | None = None,
) -> Integrity:
    """Check every distribution's files against its RECORD: :func:`begin`, then
    :meth:`PendingCheck.finish`."""
    return begin(installed, mode, memo=memo, workers=workers).finish(progress)


def _cap_per_package(issues: list[IntegrityIssue]) -> list[IntegrityIssue]:
    """At most _MAX_ISSUES_PER_PACKAGE issues per package, so a wrecked torch stays readable."""
    counts: dict[str, int] = {}
    kept = []
    for issue in issues:
        counts[issue.package] = counts.get(issue.package, 0) + 1
        if counts[issue.package] <= _MAX_ISSUES_PER_PACKAGE:
            kept.append(issue)
    return kept
