"""Do the installed files still match their RECORD?

``size`` (the default) stats every recorded file: missing files, changed sizes,
and files whose mtime is newer than the install (an edit that kept the size).
``hash`` also compares content digests, in parallel threads (hashlib releases
the GIL), with results cached in :class:`HashCache`.

Tolerated RECORD quirks, never reported as tampering: script rows (installers
rewrite shebangs), rows with neither hash nor size, ``__pycache__``/``.pyc``.
"""

from __future__ import annotations

import base64
import hashlib
import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from envguard.model import Integrity, IntegrityIssue
from envguard.probe.distributions import InstalledDist, is_fingerprinted
from envguard.probe.hashcache import HashCache, Key, stat_key
from envguard.progress import NullProgress, Progress

MODES = ("none", "size", "hash")
_MTIME_SLACK_NS = 2_000_000_000
_READ_CHUNK = 1 << 20
_BATCH_BYTES = 64 << 20
_MAX_ISSUES_PER_PACKAGE = 200


@dataclass(frozen=True, slots=True)
class _HashJob:
    package: str
    rel: str
    full: str
    algorithm: str
    expected: str
    key: Key


def _b64(digest: bytes) -> str:
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


def hash_file(path: str, algorithm: str) -> str:
    """RECORD-style digest of a file: urlsafe base64 without padding."""
    h = hashlib.new(algorithm)
    buf = bytearray(_READ_CHUNK)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as fh:
        while True:
            n = fh.readinto(buf)
            if not n:
                break
            h.update(view[:n])
    return _b64(h.digest())


def _hash_batch(jobs: list[_HashJob]) -> list[tuple[_HashJob, str | None, str | None]]:
    out: list[tuple[_HashJob, str | None, str | None]] = []
    for job in jobs:
        try:
            out.append((job, hash_file(job.full, job.algorithm), None))
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


def verify(
    installed: list[InstalledDist],
    mode: str,
    *,
    cache: HashCache | None = None,
    progress: Progress | None = None,
    workers: int | None = None,
) -> Integrity:
    """Check every distribution's files against its RECORD."""
    if mode not in MODES:
        raise ValueError(f"unknown verify mode {mode!r}")
    if mode == "none":
        return Integrity(mode="none")
    progress = progress or NullProgress()
    issues: list[IntegrityIssue] = []
    per_package: dict[str, int] = {}
    checked_files = checked_bytes = tolerated = 0
    without_record: list[str] = []
    jobs: list[_HashJob] = []

    def report(issue: IntegrityIssue) -> None:
        count = per_package.get(issue.package, 0)
        per_package[issue.package] = count + 1
        if count < _MAX_ISSUES_PER_PACKAGE:
            issues.append(issue)

    for item in installed:
        name = item.dist.name
        if item.record is None:
            if not item.dist.metadata_dir.endswith(".egg-info"):
                without_record.append(name)
            continue
        meta_dir = os.path.join(item.site_dir, item.dist.metadata_dir)
        try:
            installed_ns = os.stat(os.path.join(meta_dir, "RECORD")).st_mtime_ns
        except OSError:
            installed_ns = None
        for row in item.record:
            if not is_fingerprinted(row.path) or (not row.hash and not row.size):
                tolerated += 1
                continue
            full = os.path.normpath(os.path.join(item.site_dir, row.path))
            try:
                st = os.stat(full)
            except FileNotFoundError:
                report(IntegrityIssue(package=name, path=row.path, problem="missing"))
                continue
            except OSError as exc:
                report(IntegrityIssue(package=name, path=row.path, problem="unreadable",
                                      actual=exc.strerror))
                continue
            checked_files += 1
            checked_bytes += st.st_size
            if row.size and row.size.isdigit() and int(row.size) != st.st_size:
                report(IntegrityIssue(package=name, path=row.path, problem="size",
                                      expected=row.size, actual=str(st.st_size)))
                continue
            algorithm, _, expected = row.hash.partition("=")
            if mode == "hash" and expected and algorithm in hashlib.algorithms_available:
                key = stat_key(st)
                cached = cache.get(full, key, algorithm) if cache else None
                if cached is None:
                    jobs.append(_HashJob(name, row.path, full, algorithm, expected, key))
                elif cached != expected:
                    report(IntegrityIssue(package=name, path=row.path, problem="hash",
                                          expected=expected, actual=cached))
            elif installed_ns is not None and st.st_mtime_ns > installed_ns + _MTIME_SLACK_NS:
                report(IntegrityIssue(package=name, path=row.path,
                                      problem="modified-after-install"))

    hashed_bytes = 0
    if jobs:
        total = sum(j.key[0] for j in jobs)
        progress.start("hashing installed files", total)
        n_workers = workers or min(16, max(2, (os.cpu_count() or 2)))
        with ThreadPoolExecutor(max_workers=n_workers) as pool:
            for results in pool.map(_hash_batch, _batches(jobs)):
                for job, digest, error in results:
                    progress.advance(job.key[0])
                    if digest is None:
                        report(IntegrityIssue(package=job.package, path=job.rel,
                                              problem="unreadable", actual=error))
                        continue
                    hashed_bytes += job.key[0]
                    if cache is not None:
                        cache.put(job.full, job.key, job.algorithm, digest)
                    if digest != job.expected:
                        report(IntegrityIssue(package=job.package, path=job.rel,
                                              problem="hash", expected=job.expected,
                                              actual=digest))
        progress.finish()

    issues.sort(key=lambda i: (i.package, i.path, i.problem))
    return Integrity(
        mode=mode,
        checked_files=checked_files,
        checked_bytes=checked_bytes,
        hashed_bytes=hashed_bytes,
        tolerated=tolerated,
        issues=issues,
        without_record=sorted(without_record),
    )
