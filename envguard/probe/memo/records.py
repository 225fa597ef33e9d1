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

import marshal
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from envguard.paths import memo_dir
from envguard.probe.memo import marshal_file
from envguard.probe.memo.marshal_file import Key, prefix_digest
from envguard.probe.recordfile import RecordRow, fingerprinted_rows

if TYPE_CHECKING:
    from envguard.model import Distribution, ProbeIssue

CHUNK_ROWS = 512
"""Rows a chunk of :class:`RecordRows` holds: a unit of the RECORD check's stat work."""


_TUPLE = frozenset({tuple})
_THREE = frozenset({3})


def pack_chunk(rows: list[RecordRow]) -> bytes:
    """Rows as one chunk: a CRC-32 of the marshalled rows (4 bytes), then the rows."""
    payload = marshal.dumps(rows)
    return zlib.crc32(payload).to_bytes(4, "little") + payload


def unpack_chunk(chunk: bytes) -> list[RecordRow]:
    """:func:`pack_chunk` back; ValueError if the checksum or the shape is wrong (a memo
    file damaged on disk). The checksum spares checking 80,000 strings one by one."""
    payload = memoryview(chunk)[4:]
    if len(chunk) < 4 or zlib.crc32(payload) != int.from_bytes(chunk[:4], "little"):
        raise ValueError("corrupt RECORD chunk: checksum mismatch")
    try:
        rows = marshal.loads(payload)  # noqa: S302 - our own memo data; marshal runs no code
    except (EOFError, TypeError, ValueError) as exc:
        raise ValueError(f"corrupt RECORD chunk: {exc}") from None
    if type(rows) is not list or not set(map(type, rows)) <= _TUPLE \
            or not set(map(len, rows)) <= _THREE:
        raise ValueError("corrupt RECORD chunk: not a list of rows")
    return rows


class RecordRows:
    """A distribution's fingerprinted RECORD rows, as the records memo keeps them: chunks of
    :data:`CHUNK_ROWS` rows, each marshalled apart, unpacked on first use.

    Loading the memo then copies bytes instead of building 30,000 tuples (12-17 ms of a
    cold process on a 2-core VM, before the stat work could start), and each chunk is
    unpacked by whichever process checks it. ``reread`` parses the rows from RECORD again,
    should a chunk be corrupt (a memo is only a cache). ``py_material`` is what the torch
    compatibility key hashes of these rows (:func:`py_material`), kept with them.
    """

    __slots__ = ("_chunks", "_material", "_rows", "count", "reread", "size")

    def __init__(self, count: int, chunks: list[bytes] | None, material: bytes | None = None,
                 rows: list[RecordRow] | None = None,
                 reread: Callable[[], list[RecordRow]] | None = None,
                 size: int | None = None) -> None:
        self.count = count
        self.size = size or CHUNK_ROWS
        """Rows a chunk (the memo file says how many it packed)."""
        self._chunks = chunks
        self._material = material
        self._rows = rows
        self.reread = reread

    @classmethod
    def of(cls, rows: list[RecordRow]) -> RecordRows:
        return cls(len(rows), None, rows=rows)

    def __len__(self) -> int:
        return self.count

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RecordRows) and self.rows() == other.rows()

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"RecordRows({self.count} rows)"

    def rows(self) -> list[RecordRow]:
        """Every row, unpacked (once)."""
        if self._rows is None:
            try:
                self._rows = [row for chunk in self.chunks() for row in unpack_chunk(chunk)]
            except ValueError:
                if self.reread is None:
                    raise
                self._rows = self.reread()
        return self._rows

    def chunks(self) -> list[bytes]:
        """The rows in marshalled chunks of :data:`CHUNK_ROWS` (packed once)."""
        if self._chunks is None:
            rows = self._rows or []
            self._chunks = [pack_chunk(rows[start:start + self.size])
                            for start in range(0, len(rows), self.size)]
        return self._chunks

    def chunk_sizes(self) -> list[int]:
        """The row count of each chunk."""
        return [min(self.size, self.count - start) for start in range(0, self.count, self.size)]

    def chunk_rows(self, number: int) -> list[RecordRow]:
        """The rows of chunk ``number`` (all rows are parsed again if it is corrupt)."""
        start = number * self.size
        if self._rows is not None:
            return self._rows[start:start + self.size]
        try:
            return unpack_chunk(self.chunks()[number])
        except ValueError:
            return self.rows()[start:start + self.size]

    def py_material(self) -> bytes:
        """:func:`py_material` of the rows (computed once, or kept by the memo)."""
        if self._material is None:
            self._material = py_material(self.rows())
        return self._material

    def packed(self) -> tuple[int, int, list[bytes], bytes]:
        """As the memo file stores it: (rows, rows a chunk, chunks, :meth:`py_material`)."""
        return (self.count, self.size, self.chunks(), self.py_material())

    @classmethod
    def unpacked(cls, value: Any, reread: Callable[[], list[RecordRow]] | None = None
                 ) -> RecordRows:
        """:meth:`packed` back; ValueError for a value of another shape."""
        if not (type(value) is tuple and len(value) == 4 and type(value[0]) is int
                and type(value[1]) is int and value[1] > 0
                and type(value[2]) is list and all(type(c) is bytes for c in value[2])
                and type(value[3]) is bytes
                and len(value[2]) == -(-value[0] // value[1])):
            raise ValueError("not packed RECORD rows")
        return cls(value[0], value[2], value[3], reread=reread, size=value[1])


def py_material(rows: list[RecordRow]) -> bytes:
    """The ``.py`` rows' path and digest, sorted and joined: what the torch compatibility key
    (:func:`~envguard.probe.torch_identity.compat_key`) hashes of torch's RECORD."""
    return "".join(sorted(path + digest for path, digest, _ in rows
                          if path.endswith(".py"))).encode()


Parsed = tuple[int, RecordRows, str]
"""(rows in RECORD, fingerprinted rows, fingerprint)."""


_FOLDER = "folder:"
"""Prefix of a dist-info folder's entry (a RECORD's entry is its path)."""
_FOLDER_FIELDS = 16
"""The length of :func:`folder_entry`'s tuple."""


class RecordMemo:
    TAG = ("envguard-records", 4)
    """The file format's tag: 2 added the dist-info folders, 3 packed the rows
    (:class:`RecordRows`), 4 gave each chunk a checksum."""

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
                and len(hit[1]) == 3:
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
    def reread() -> list[RecordRow]:
        return fingerprinted_rows(record_path)
    return reread


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
