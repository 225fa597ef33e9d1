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

A dist-info folder's entry holds the distribution as a tuple of its fields in the model's
order (:class:`Codec`), so a field added to :class:`~envguard.model.Distribution` is kept
with no edit here; the file's tag carries a digest of those fields (:func:`fields_digest`),
so a file written for other fields is ignored rather than misread.
"""

from __future__ import annotations

import functools
import hashlib
import operator
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from envguard.paths import memo_dir, rebased
from envguard.probe.fastpath import marshal_file
from envguard.probe.fastpath.marshal_file import Key, prefix_digest
from envguard.probe.fastpath.rows import RecordRows
from envguard.probe.recordfile import RecordRow, fingerprinted_rows

if TYPE_CHECKING:
    from envguard.model import Distribution, ProbeIssue

Parsed = tuple[int, RecordRows, str]
"""(rows in RECORD, fingerprinted rows, fingerprint)."""


_FOLDER = "folder:"
"""Prefix of a dist-info folder's entry (a RECORD's entry is its path)."""
_ROWS, _TOTAL, _MTIME, _ISSUES, _FIELDS = range(5)
"""Positions in a folder entry's value (:func:`folder_entry`): the fingerprinted RECORD rows
packed (or None), the rows in RECORD, RECORD's mtime, the read's issues, and the
distribution's fields. The first four are this module's own, so that stat-ahead can read
the rows and the mtime before :mod:`envguard.model` is imported."""
_FOLDER_LENGTH = 5


class RecordMemo:
    TAG = ("envguard-records", 6)
    """The file format's tag: 2 added the dist-info folders, 3 packed the rows
    (:class:`~envguard.probe.fastpath.rows.RecordRows`), 4 gave each chunk a checksum, 5 laid
    the header rows out by folder, 6 laid a folder entry out by the model's fields. A file
    also carries :func:`fields_digest` after the tag (:meth:`_live`)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._entries: dict[str, Any]
        self._entries, self._fields, self.load_error = marshal_file.load_extended(
            path, self.TAG)
        self._checked = False
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

    def _live(self) -> dict[str, Any]:
        """The entries, once the field digest the file was written with is known to be
        :func:`fields_digest`; none if it is another (a file written when the model had
        other fields is ignored as a whole). Checked on the first lookup, not on load:
        :mod:`~envguard.probe.fastpath.statahead` loads the file before the model is
        imported, and :meth:`folder_records` does not check it."""
        if not self._checked:
            self._checked = True
            if self._fields != (fields_digest(),):
                self._entries = {}
                self._rows.clear()
        return self._entries

    def get(self, record_path: str, key: Key) -> Parsed | None:
        hit = self._live().get(record_path)
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
        self._live()[record_path] = (key, (total, rows.packed(), fingerprint))
        self._used.add(record_path)
        self._dirty = True

    def get_folder(self, meta_dir: str, key: tuple[Any, ...]) -> tuple[Any, ...] | None:
        """What :func:`~envguard.probe.distributions.read_distribution` read from the
        dist-info folder ``meta_dir`` when its files had ``key`` (:func:`folder_entry`'s
        value, its RECORD rows unpacked), for :func:`folder_parts`."""
        name = _FOLDER + meta_dir
        hit = self._live().get(name)
        if type(hit) is tuple and len(hit) == 2 and hit[0] == key and type(hit[1]) is tuple \
                and len(hit[1]) == _FOLDER_LENGTH:
            value = hit[1]
            try:
                rows = None if value[_ROWS] is None else self._folder_rows(meta_dir,
                                                                            value[_ROWS])
            except ValueError:
                return None
            self._used.add(name)
            return (rows, *value[_ROWS + 1:])
        return None

    def _folder_rows(self, meta_dir: str, packed: Any) -> RecordRows:
        """The :class:`RecordRows` of a folder entry, made once: stat-ahead's units and the
        scan's distribution share it, and what it has unpacked."""
        rows = self._rows.get(meta_dir)
        if rows is None:
            rows = RecordRows.unpacked(packed, _rereader(f"{meta_dir}/RECORD"))
            self._rows[meta_dir] = rows
        return rows

    def folder_records(self) -> Iterator[tuple[str, RecordRows, int | None]]:
        """(dist-info folder, fingerprinted RECORD rows, RECORD's mtime) of every folder
        entry as loaded, before any lookup and before the field digest is checked: what
        :mod:`~envguard.probe.fastpath.statahead` stats ahead. Which of these a snapshot may
        take is decided by :meth:`get_folder`: only a folder it finds unchanged."""
        for name, hit in self._entries.items():
            if not name.startswith(_FOLDER) or type(hit) is not tuple or len(hit) != 2:
                continue
            value = hit[1]
            if type(value) is tuple and len(value) == _FOLDER_LENGTH \
                    and value[_ROWS] is not None and type(value[_MTIME]) in _INT_OR_NONE:
                meta_dir = name[len(_FOLDER):]
                try:
                    yield meta_dir, self._folder_rows(meta_dir, value[_ROWS]), value[_MTIME]
                except ValueError:
                    continue

    def put_folder(self, meta_dir: str, key: tuple[Any, ...], value: tuple[Any, ...]) -> None:
        name = _FOLDER + meta_dir
        self._live()[name] = (key, value)
        self._rows.pop(meta_dir, None)
        self._used.add(name)
        self._dirty = True

    def save(self) -> str | None:
        """Write if anything changed, dropping RECORDs that no longer exist in this env."""
        entries = self._live()
        stale = set(entries) - self._used
        if not self._dirty and not stale:
            return None
        kept = {k: v for k, v in entries.items() if k in self._used}
        error = marshal_file.save(self.path, (*self.TAG, fields_digest()), kept)
        if error is None:
            self._entries, self._dirty = kept, False
        return error


class BorrowedMemo(RecordMemo):
    """The memo of the environment at ``prefix``, read through the paths of its scratch copy
    at ``copy`` (:mod:`envguard.install.scratch`), never written. The copy's dist-info files
    are symbolic links to the environment's, so a folder the installer left alone has the
    very stat keys the environment's entry was made with (``os.stat`` follows the link) and
    is not read again; a folder the installer wrote has new inodes, so it misses and is
    read."""

    def __init__(self, prefix: str, copy: str, root: Path | None = None) -> None:
        super().__init__(self.for_prefix_path(prefix, root))
        self._prefix, self._copy = prefix.rstrip(os.sep), copy.rstrip(os.sep)

    def _theirs(self, path: str) -> str:
        return rebased(path, self._copy, self._prefix)

    def get(self, record_path: str, key: Key) -> Parsed | None:
        return super().get(self._theirs(record_path), key)

    def put(self, record_path: str, key: Key, parsed: Parsed) -> None:
        return None

    def get_folder(self, meta_dir: str, key: tuple[Any, ...]) -> tuple[Any, ...] | None:
        return super().get_folder(self._theirs(meta_dir), key)

    def put_folder(self, meta_dir: str, key: tuple[Any, ...], value: tuple[Any, ...]) -> None:
        return None

    def save(self) -> str | None:
        return None


def _rereader(record_path: str) -> Callable[[], list[RecordRow]]:
    """Parses the fingerprinted rows from ``record_path`` again (a corrupt chunk)."""
    return functools.partial(fingerprinted_rows, record_path)


def folder_entry(d: Distribution, record: RecordRows | None, total: int,
                 mtime_ns: int | None, issues: list[ProbeIssue]) -> tuple[Any, ...]:
    """A dist-info folder's read, as plain data for the memo file (positions ``_ROWS`` ...
    ``_FIELDS``); ``d`` as :class:`Codec` lays it out."""
    fields = layout()
    return (None if record is None else record.packed(), total, mtime_ns,
            [fields.issue.encode(i) for i in issues], fields.dist.encode(d))


def folder_parts(value: tuple[Any, ...], site_dir: str, meta_name: str) -> tuple[
        Distribution, RecordRows | None, int, int | None, list[ProbeIssue]]:
    """:meth:`RecordMemo.get_folder`'s value back; raises ValueError, TypeError or IndexError
    on an entry of another shape (forged or damaged: a miss)."""
    record, total, mtime_ns, issues, values = value
    fields = layout()
    if record is not None and type(record) is not RecordRows:
        raise TypeError("RECORD rows of another shape")
    if not (type(total) is int and type(mtime_ns) in _INT_OR_NONE and type(issues) is list
            and all(map(fields.issue.check, issues)) and fields.dist.check(values)):
        raise TypeError("a dist-info entry of another shape")
    dist = fields.dist.decode(values, location=site_dir, metadata_dir=meta_name)
    return dist, record, total, mtime_ns, [fields.issue.decode(i) for i in issues]


_INT_OR_NONE = (int, type(None))


# -- a record of the model as a tuple of its fields -----------------------------------------

NOT_STORED = ("location", "metadata_dir", "shadowed")
"""Fields of :class:`~envguard.model.Distribution` a folder entry does not hold: the site
folder and the dist-info folder's name are the entry's name, and the scan sets ``shadowed``
once every folder is read."""
_SCALARS = {"str": str, "int": int, "bool": bool, "float": float}
_NONE = type(None)


class _Part:
    """How one field is kept: the types its value may have (``kinds``: exact types, none
    for a field of a type this module does not know), a ``deep`` check of a value that is
    not None, ``encode`` and ``decode`` for one that is not None (None: kept as it is), and
    the record class it holds, if it does."""

    __slots__ = ("decode", "deep", "encode", "kinds", "nested")

    def __init__(self, kinds: tuple[type, ...], deep: Callable[[Any], bool] | None = None,
                 encode: Callable[[Any], Any] | None = None,
                 decode: Callable[[Any], Any] | None = None,
                 nested: Codec | None = None) -> None:
        self.kinds, self.deep, self.encode, self.decode = kinds, deep, encode, decode
        self.nested = nested


class Codec:
    """A record class of :mod:`envguard.model` as a tuple of its fields' values, in
    ``dataclasses.fields`` order (less ``skip``), and back. A field may hold a ``str``,
    ``int``, ``bool`` or ``float``, a ``list[str]``, a ``dict[str, str]``, another record
    class of the model (as its own tuple), or any of these ``| None``; a value read back is
    checked for its exact type. A field of another type never reads back (:meth:`check` is
    false), so every entry is a miss:
    ``tests/envguard/probe/fastpath/test_record_rows.py`` round-trips a distribution
    with every field set, and fails for such a field."""

    __slots__ = ("_decoders", "_deep", "_encoders", "_kinds", "_parts", "cls", "names")

    def __init__(self, cls: type, skip: tuple[str, ...] = ()) -> None:
        import dataclasses

        module = sys.modules[cls.__module__]  # where the classes its fields name are defined
        fields = [f for f in dataclasses.fields(cls) if f.name not in skip]
        self.cls = cls
        self.names = tuple(f.name for f in fields)
        self._parts = tuple(_part(str(f.type), module) for f in fields)
        self._kinds = tuple(p.kinds for p in self._parts)
        self._deep = tuple((i, p.deep) for i, p in enumerate(self._parts) if p.deep)
        self._encoders = tuple((i, p.encode) for i, p in enumerate(self._parts) if p.encode)
        self._decoders = tuple((n, p.decode) for n, p in zip(self.names, self._parts,
                                                              strict=True) if p.decode)

    def encode(self, record: Any) -> tuple[Any, ...]:
        values = [getattr(record, name) for name in self.names]
        for i, encode in self._encoders:
            if values[i] is not None:
                values[i] = encode(values[i])
        return tuple(values)

    def check(self, value: Any) -> bool:
        """Whether ``value`` is a tuple :meth:`decode` takes (every value of its type)."""
        return (type(value) is tuple and len(value) == len(self._kinds)
                and all(map(operator.contains, self._kinds, map(type, value)))
                and all(value[i] is None or deep(value[i]) for i, deep in self._deep))

    def decode(self, value: tuple[Any, ...], **given: Any) -> Any:
        """The record from a tuple :meth:`check` accepted; ``given``: the fields skipped."""
        fields = dict(zip(self.names, value, strict=True), **given)
        for name, decode in self._decoders:
            if fields[name] is not None:
                fields[name] = decode(fields[name])
        return self.cls(**fields)

    def shape(self) -> tuple[Any, ...]:
        """The field names, with those of the record classes it holds."""
        return tuple((n, None if p.nested is None else p.nested.shape())
                     for n, p in zip(self.names, self._parts, strict=True))


def _part(hint: str, module: Any) -> _Part:
    """How a field annotated ``hint`` (a string: the model's annotations are not evaluated)
    is kept; a record class it names is looked up in ``module``."""
    import dataclasses

    optional = hint.endswith(" | None")
    base = hint[:-len(" | None")] if optional else hint
    more = (_NONE,) if optional else ()
    if base in _SCALARS:
        return _Part((_SCALARS[base], *more))
    if base == "list[str]":
        return _Part((list, *more), _strings, decode=list)  # a list of each record's own
    if base == "dict[str, str]":
        return _Part((dict, *more), _string_map, decode=dict)
    cls = getattr(module, base, None)
    if isinstance(cls, type) and dataclasses.is_dataclass(cls):
        codec = Codec(cls)
        return _Part((tuple, *more), codec.check, codec.encode, codec.decode, codec)
    return _Part(())


def _string_map(value: Any) -> bool:
    return all(type(k) is str and type(v) is str for k, v in value.items())


def _strings(value: Any) -> bool:
    return set(map(type, value)) <= _STR


_STR = frozenset({str})


class Layout:
    """How a folder entry holds a distribution and its issues, and the digest of that."""

    __slots__ = ("digest", "dist", "issue")

    def __init__(self) -> None:
        from envguard.model import Distribution, ProbeIssue

        self.dist = Codec(Distribution, NOT_STORED)
        self.issue = Codec(ProbeIssue)
        shape = repr((self.dist.shape(), self.issue.shape())).encode()
        self.digest = hashlib.sha256(shape).hexdigest()[:12]


@functools.cache
def layout() -> Layout:
    """The layout for the model as imported (built once, on first use)."""
    return Layout()


def fields_digest() -> str:
    """A short digest of the field names a folder entry holds (:class:`Layout`): part of
    the file's tag, so that a memo written when the model had other fields is ignored."""
    return layout().digest
