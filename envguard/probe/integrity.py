"""Do the installed files still match their RECORD?

``size`` (the default) stats every recorded file: missing files, changed sizes,
and files whose mtime is newer than the install (an edit that kept the size). Header
files under an ``include`` folder that is itself unchanged since the install are vouched
for by that folder (:mod:`~envguard.probe.recordcheck`).
``hash`` also compares content digests, in parallel threads (hashlib releases
the GIL), with results memoised in :class:`~envguard.probe.fastpath.hashes.HashMemo`.

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

import hashlib
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field

from envguard.frozen import frozen
from envguard.model import Integrity, IntegrityIssue
from envguard.probe.background import parallel_map
from envguard.probe.distributions import InstalledDist
from envguard.probe.fastpath.hashes import HashMemo
from envguard.probe.fastpath.marshal_file import Key
from envguard.probe.fastpath.statahead import Ahead, StatQueue, units_of, worker_count
from envguard.probe.progress import NullProgress, Progress
from envguard.probe.recordcheck import (
    NOT_REGULAR,
    OUTSIDE,
    Checked,
    check_rows,
    file_kind,
    install_tree,
)

__all__ = ["MODES", "NOT_REGULAR", "OUTSIDE", "PendingCheck", "begin", "default_workers",
           "file_kind", "hash_file", "install_tree", "record_digest", "verify"]

MODES = ("none", "size", "hash")
_READ_CHUNK = 1 << 20
_BATCH_BYTES = 64 << 20
_MAX_ISSUES_PER_PACKAGE = 200


@frozen(kw_only=False)
class _HashJob:
    package: str
    rel: str
    full: str
    algorithm: str
    expected: str
    key: Key
    links: int


def record_digest(digest: bytes) -> str:
    """A digest as RECORD writes it: urlsafe base64 without padding."""
    import base64  # here: only hashing needs it

    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


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


def default_workers() -> int:
    """Threads for hashing (hashlib releases the GIL for large buffers)."""
    return max(2, min(16, os.cpu_count() or 2))


def _issues(package: str, checked: Checked) -> list[IntegrityIssue]:
    links = checked.links
    return [IntegrityIssue(package=package, path=p, problem=k, expected=e, actual=a,
                           links=links.get(p)) for p, k, e, a in checked.issues]


@dataclass(slots=True)
class PendingCheck:
    """A RECORD check under way (:func:`begin`); :meth:`finish` completes it.

    In ``size`` mode the ``stat`` work is shared with forked workers through a
    :class:`~envguard.probe.fastpath.statahead.StatQueue`: the one
    :mod:`~envguard.probe.fastpath.statahead` started before the collector was imported
    (``queued`` are its units this check claimed), else one :func:`begin` starts when
    there are enough rows. This process checks ``own`` first (the distributions the early
    queue does not cover), then takes units from the queue with the workers. Threads cannot
    do this: measured on the 16-core H200 host, 48,706 stats took 0.115 s serially and
    0.33 s spread over 4-16 threads (the per-row Python work serialises on the GIL).
    Hashing is the part that parallelises in threads (``workers``).
    """

    installed: list[InstalledDist]
    mode: str
    memo: HashMemo | None
    workers: int
    own: list[InstalledDist]
    queue: StatQueue | None = None
    queued: dict[int, str] = field(default_factory=dict)
    """Unit number in ``queue`` -> the package it checks."""

    def finish(self, progress: Progress | None = None) -> Integrity:
        if self.mode == "none":
            return Integrity(mode="none")
        try:
            return self._finish(progress or NullProgress())
        except BaseException:
            if self.queue is not None:
                self.queue.abandon()
            raise

    def _finish(self, progress: Progress) -> Integrity:
        hashing = self.mode == "hash"
        memo = self.memo
        known = memo.get if memo is not None else None
        files = size = tolerated = by_folder = 0
        issues: list[IntegrityIssue] = []
        jobs: list[_HashJob] = []
        done = [(i.dist.name, check_rows(i.site_dir, i.record.rows() if i.record else [],
                                         i.record_mtime_ns, hashing=hashing, known=known))
                for i in self.own]
        if self.queue is not None:
            answers = self.queue.finish(self.queued)
            done.extend((self.queued[n], answers[n]) for n in sorted(answers))
        for package, checked in done:
            files += checked.files
            size += checked.size
            tolerated += checked.tolerated
            by_folder += checked.by_folder
            issues.extend(_issues(package, checked))
            jobs.extend(_HashJob(package, *job) for job in checked.jobs)
        with_record = [i for i in self.installed if i.record is not None]
        without_record = sorted(
            i.dist.name for i in self.installed
            if i.record is None and not i.dist.metadata_dir.endswith(".egg-info")
        )
        skipped = sum(i.record_total - (i.record.count if i.record else 0)
                      for i in with_record)
        hashed_bytes = _hash_jobs(jobs, memo, self.workers, progress, issues) if jobs else 0
        issues.sort(key=lambda i: (i.package, i.path, i.problem))
        return Integrity(
            mode=self.mode,
            checked_files=files,
            checked_bytes=size,
            hashed_bytes=hashed_bytes,
            tolerated=skipped + tolerated,
            issues=_cap_per_package(issues),
            without_record=without_record,
            checked_by_folder=by_folder,
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
                                             expected=job.expected, actual=digest,
                                             links=job.links if job.links > 1 else None))
    progress.finish()
    return hashed_bytes


def begin(installed: list[InstalledDist], mode: str, *, memo: HashMemo | None = None,
          workers: int | None = None, ahead: Ahead | None = None) -> PendingCheck:
    """Start checking every distribution's files against its RECORD (see
    :class:`PendingCheck`); raises ValueError for an unknown mode. ``ahead``: the stat work
    :mod:`~envguard.probe.fastpath.statahead` started on the records memo that the scan of
    ``installed`` read (size mode; abandoned in any other). Its units are claimed for the
    distributions the scan read from that memo (``from_memo``)."""
    if mode not in MODES:
        raise ValueError(f"unknown verify mode {mode!r}")
    with_record = [i for i in installed if i.record is not None] if mode != "none" else []
    pending = PendingCheck(installed=installed, mode=mode, memo=memo,
                           workers=workers or default_workers(), own=with_record)
    early = ahead.queue if ahead is not None and mode == "size" else None
    if ahead is not None and early is None:
        ahead.abandon()
    if ahead is not None and early is not None:
        pending.queue, pending.own = early, []
        for item in with_record:
            numbers = ahead.units_for(os.path.join(item.site_dir, item.dist.metadata_dir),
                                      item.record_mtime_ns, from_memo=item.from_memo)
            if numbers is None:
                pending.own.append(item)
            else:
                pending.queued.update(dict.fromkeys(numbers, item.dist.name))
        return pending
    if mode != "size":
        return pending
    count = worker_count(sum(i.record.count for i in with_record if i.record))
    if count <= 0:
        return pending
    units, names = [], []
    for item in with_record:
        if item.record is None:
            continue
        more = units_of(item.site_dir, item.record, item.record_mtime_ns)
        units.extend(more)
        names.extend([item.dist.name] * len(more))
    try:
        queue = StatQueue(units)
    except (OSError, ValueError):  # no pipe (a descriptor limit): this process does it all
        return pending
    queue.fork(count)
    pending.queue, pending.queued, pending.own = queue, dict(enumerate(names)), []
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
