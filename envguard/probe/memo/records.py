"""Parsed RECORDs and dist-info folders, memoised by the stat keys of the files read.

Parsing, filtering and fingerprinting 30,000 RECORD rows takes about 50 ms; an
installer rewrites RECORD on every install, so an unchanged (size, mtime, ctime,
inode) means an unchanged parse. Reading the rest of a dist-info folder (METADATA,
WHEEL, INSTALLER, direct_url.json, REQUESTED) took 66-74 ms of the gate for the 197
distributions of the H200 host's venv; a folder whose files all keep their keys (a
missing file is part of the key) is read from here in one ``stat`` per file. The
inode change time is in every key and cannot be set by a user, so an edit made with
the size and modification time put back still counts as an edit. One memo file per
environment prefix.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from envguard.paths import memo_dir
from envguard.probe.memo import marshal_file
from envguard.probe.memo.marshal_file import Key, prefix_digest
from envguard.probe.memo.rows import RecordRows
from envguard.probe.recordfile import RecordRow, fingerprinted_rows

if TYPE_CHECKING:
    from envguard.model import Distribution, ProbeIssue

Parsed = tuple[int, RecordRows, str]
"""(rows in RECORD, fingerprinted rows, fingerprint)."""


_FOLDER = "folder:"
"""Prefix of a dist-info folder's entry (a RECORD's entry is its path)."""
_FOLDER_FIELDS = 16
"""The length of :func:`folder_entry`'s tuple."""


class RecordMemo:
    TAG = ("envguard-records", 5)
    """The file format's tag: 2 added the dist-info folders, 3 packed the rows
    (:class:`~envguard.probe.memo.rows.RecordRows`), 4 gave each chunk a checksum, 5 laid
    the header rows out by folder."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._entries: dict[str, Any]
        self._entries, self.load_error = marshal_file.load(path, self.TAG)
        self._used: set[str] = set()
        self._dirty = False
        self._rows: dict[str, RecordRows] = {}

    @classmethod
    def for_prefix(cls, prefix: str, root: Path | None = None) -> RecordMemo:
        return cls(cls.for_prefix_path(prefix, root))

    @staticmethod
    def for_prefix_path(prefix: str, root: Path | None = None) -> Path:
        """The memo file of the environment at ``prefix``."""
        return (root or memo_dir()) / f"records-{prefix_digest(prefix)}.marshal"

    def get(self, record_path: str, key: Key) -> Parsed | None:
        hit = self._entries.get(record_path)
        if type(hit) is tuple and len(hit) == 2 and hit[0] == key and type(hit[1]) is tuple \
                and len(hit[1]) == 3 and type(hit[1][0]) is int and type(hit[1][2]) is str:
            total, packed, fingerprint = hit[1]
            try:
                rows = RecordRows.unpacked(packed, _rereader(record_path))
            except ValueError:
                return None
            self._used.add(record_path)
            return total, rows, fingerprint
        return None

    def put(self, record_path: str, key: Key, parsed: Parsed) -> None:
        total, rows, fingerprint = parsed
        self._entries[record_path] = (key, (total, rows.packed(), fingerprint))
        self._used.add(record_path)
        self._dirty = True

    def get_folder(self, meta_dir: str, key: tuple[Any, ...]) -> tuple[Any, ...] | None:
        """What :func:`~envguard.probe.distributions.read_distribution` read from the
        dist-info folder ``meta_dir`` when its files had ``key`` (its RECORD rows as the
        :class:`RecordRows` :meth:`folder_records` handed out, if it did)."""
        name = _FOLDER + meta_dir
        hit = self._entries.get(name)
        if type(hit) is tuple and len(hit) == 2 and hit[0] == key and type(hit[1]) is tuple \
                and len(hit[1]) == _FOLDER_FIELDS:
            value = hit[1]
            try:
                rows = None if value[12] is None else self._folder_rows(meta_dir, value[12])
            except ValueError:
                return None
            self._used.add(name)
            return (*value[:12], rows, *value[13:])
        return None

    def _folder_rows(self, meta_dir: str, packed: Any) -> RecordRows:
        """One :class:`RecordRows` a folder entry, the same object on every request."""
        rows = self._rows.get(meta_dir)
        if rows is None:
            rows = RecordRows.unpacked(packed, _rereader(f"{meta_dir}/RECORD"))
            self._rows[meta_dir] = rows
        return rows

    def folder_records(self) -> Iterator[tuple[str, RecordRows, int | None]]:
        """(dist-info folder, fingerprinted RECORD rows, RECORD's mtime) of every folder
        entry as loaded, before any lookup: what :mod:`~envguard.probe.statahead` stats
        ahead. The rows are the very object :meth:`get_folder` hands out later, so a caller
        can tell by identity that a scan found the folder unchanged."""
        for name, hit in self._entries.items():
            if not name.startswith(_FOLDER) or type(hit) is not tuple or len(hit) != 2:
                continue
            value = hit[1]
            if type(value) is tuple and len(value) == _FOLDER_FIELDS \
                    and value[12] is not None and type(value[14]) in (int, type(None)):
                meta_dir = name[len(_FOLDER):]
                try:
                    yield meta_dir, self._folder_rows(meta_dir, value[12]), value[14]
                except ValueError:
                    continue

    def put_folder(self, meta_dir: str, key: tuple[Any, ...], value: tuple[Any, ...]) -> None:
        name = _FOLDER + meta_dir
        self._entries[name] = (key, value)
        self._rows.pop(meta_dir, None)
        self._used.add(name)
        self._dirty = True

    def save(self) -> str | None:
        """Write if anything changed, dropping RECORDs that no longer exist in this env."""
        stale = set(self._entries) - self._used
        if not self._dirty and not stale:
            return None
        kept = {k: v for k, v in self._entries.items() if k in self._used}
        error = marshal_file.save(self.path, self.TAG, kept)
        if error is None:
            self._entries, self._dirty = kept, False
        return error


def _rereader(record_path: str) -> Callable[[], list[RecordRow]]:
    """Parses the fingerprinted rows from ``record_path`` again (a corrupt chunk)."""
    return functools.partial(fingerprinted_rows, record_path)


def folder_entry(d: Distribution, record: RecordRows | None, total: int,
                 mtime_ns: int | None, issues: list[ProbeIssue]) -> tuple[Any, ...]:
    """A dist-info folder's read, as plain data for the memo file (the folder's location
    is not stored: it is the entry's name)."""
    u = d.direct_url
    url = None if u is None else (u.url, u.editable, u.vcs, u.commit_id, u.requested_revision,
                                  u.archive_hash, u.subdirectory)
    return (d.name, d.version, d.installer, d.requested, d.editable, url, d.fingerprint,
            d.record_entries, d.wheel_generator, d.wheel_tags, d.wheel_build, d.requires,
            None if record is None else record.packed(), total, mtime_ns,
            [(i.section, i.message, i.path) for i in issues])


def folder_parts(value: tuple[Any, ...], site_dir: str, meta_name: str) -> tuple[
        Distribution, RecordRows | None, int, int | None, list[ProbeIssue]]:
    """:meth:`RecordMemo.get_folder`'s value back; raises ValueError, TypeError or IndexError
    on an entry of another shape."""
    from envguard.model import DirectUrl, Distribution, ProbeIssue  # not before the scan

    (name, version, installer, requested, editable, url, fingerprint, entries, generator,
     tags, build, requires, record, total, mtime_ns, issues) = value
    if record is not None and type(record) is not RecordRows:
        raise TypeError("RECORD rows of another shape")
    if not (type(name) is str and _texts(version, installer, fingerprint, generator, build)
            and type(requested) is bool and type(editable) is bool and type(entries) is int
            and type(total) is int and type(mtime_ns) in _INT_OR_NONE
            and _strings(tags) and _strings(requires)
            and (url is None or (type(url) is tuple and len(url) == 7 and type(url[0]) is str
                                 and type(url[1]) is bool and _texts(*url[2:])))
            and type(issues) is list and all(type(i) is tuple and len(i) == 3
                                             and type(i[0]) is str and type(i[1]) is str
                                             and _texts(i[2]) for i in issues)):
        raise TypeError("a dist-info entry of another shape")  # forged or damaged: a miss
    direct = None if url is None else DirectUrl(
        url=url[0], editable=url[1], vcs=url[2], commit_id=url[3], requested_revision=url[4],
        archive_hash=url[5], subdirectory=url[6])
    dist = Distribution(name=name, version=version, location=site_dir, metadata_dir=meta_name,
                        installer=installer, requested=requested, editable=editable,
                        direct_url=direct, fingerprint=fingerprint, record_entries=entries,
                        wheel_generator=generator, wheel_tags=list(tags), wheel_build=build,
                        requires=list(requires))
    return (dist, record, total, mtime_ns,
            [ProbeIssue(section=a, message=b, path=c) for a, b, c in issues])


_INT_OR_NONE = (int, type(None))
_STR_OR_NONE = (str, type(None))


def _texts(*values: Any) -> bool:
    return all(type(v) in _STR_OR_NONE for v in values)


def _strings(value: Any) -> bool:
    return type(value) is list and all(type(v) is str for v in value)
