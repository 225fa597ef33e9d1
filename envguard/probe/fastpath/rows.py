"""RECORD rows as the records memo keeps them: checksummed chunks, unpacked on first use.

Loading a memo of 30,000 rows as tuples took 12-17 ms of a cold process on a 2-core VM,
before the RECORD check's stat work could start. Kept as bytes, the rows cost a copy to
load, and each chunk is unpacked by whichever process checks it
(:mod:`~envguard.probe.fastpath.statahead`).

The chunks follow a layout (:func:`layout`): first the rows stat'ed one by one, then the
header rows that a folder may vouch for (:func:`~envguard.probe.recordcheck.header_row`),
grouped by folder. Each header chunk carries a summary, (folder, rows) per folder, so that
checking it while its folders are unchanged reads neither its rows nor stats its files.
"""

from __future__ import annotations

import itertools
import marshal
import zlib
from collections.abc import Callable
from typing import Any

from envguard.probe.fastpath.marshal_file import loads
from envguard.probe.recordcheck import header_row
from envguard.probe.recordfile import RecordRow

CHUNK_ROWS = 512
"""Rows a chunk holds: a unit of the RECORD check's stat work."""
Summary = tuple[tuple[str, int], ...]
"""A chunk of header rows: (folder, rows of the chunk in it) for each of its folders."""

_TUPLE = frozenset({tuple})
_THREE = frozenset({3})


def layout(rows: list[RecordRow], size: int
           ) -> tuple[list[RecordRow], list[int], list[Summary | None]]:
    """``rows`` in chunks of at most ``size``: the rows stat'ed one by one, then the header
    rows by folder (a folder may run over into the next chunk); (the rows in chunk order,
    each chunk's row count, each chunk's summary or None)."""
    plain: list[RecordRow] = []
    headers: dict[str, list[RecordRow]] = {}
    for row in rows:
        folder = header_row(*row)
        if folder is None:
            plain.append(row)
        else:
            headers.setdefault(folder, []).append(row)
    ordered = plain + [row for group in headers.values() for row in group]
    tags = [folder for folder, group in headers.items() for _ in group]
    counts: list[int] = []
    summaries: list[Summary | None] = []
    for start in range(0, len(ordered), size):
        stop = min(start + size, len(ordered))
        counts.append(stop - start)
        if start < len(plain):  # rows to stat (the last such chunk may hold header rows too)
            summaries.append(None)
            continue
        part = tags[start - len(plain):stop - len(plain)]
        summaries.append(tuple((f, len(list(g))) for f, g in itertools.groupby(part)))
    return ordered, counts, summaries


def pack_chunk(rows: list[RecordRow]) -> bytes:
    """Rows as one chunk: a CRC-32 of the marshalled rows (4 bytes), then the rows."""
    payload = marshal.dumps(rows)
    return zlib.crc32(payload).to_bytes(4, "little") + payload


def unpack_chunk(chunk: bytes) -> list[RecordRow]:
    """:func:`pack_chunk` back; ValueError if the checksum or the shape is wrong (a memo
    file damaged on disk, or forged: rows that are not three strings are refused too)."""
    payload = memoryview(chunk)[4:]
    if len(chunk) < 4 or zlib.crc32(payload) != int.from_bytes(chunk[:4], "little"):
        raise ValueError("corrupt RECORD chunk: checksum mismatch")
    try:
        rows = loads(payload)
        if type(rows) is not list or not set(map(type, rows)) <= _TUPLE \
                or not set(map(len, rows)) <= _THREE:
            raise ValueError("not a list of rows")
        "".join(itertools.chain.from_iterable(rows))  # TypeError unless every field is a str
    except (EOFError, TypeError, ValueError, MemoryError) as exc:
        raise ValueError(f"corrupt RECORD chunk: {exc}") from None
    return rows


def py_material(rows: list[RecordRow]) -> bytes:
    """The ``.py`` rows' path and digest, sorted and joined: what the torch compatibility key
    (:func:`~envguard.probe.torch_identity.compat_key`) hashes of torch's RECORD."""
    return "".join(sorted(path + digest for path, digest, _ in rows
                          if path.endswith(".py"))).encode()


class RecordRows:
    """A distribution's fingerprinted RECORD rows: given as a list (:meth:`of`), or packed
    in the memo's chunks (:meth:`unpacked`). ``reread`` parses them from RECORD again,
    should a chunk be corrupt (a memo is only a cache). ``py_material`` is what the torch
    compatibility key hashes of these rows, kept with them."""

    __slots__ = ("_chunks", "_counts", "_material", "_ordered", "_rows", "_summaries", "count",
                 "reread", "size")

    def __init__(self, count: int, *, rows: list[RecordRow] | None = None,
                 chunks: list[bytes] | None = None, counts: list[int] | None = None,
                 summaries: list[Summary | None] | None = None, material: bytes | None = None,
                 size: int | None = None,
                 reread: Callable[[], list[RecordRow]] | None = None) -> None:
        self.count = count
        self.size = size or CHUNK_ROWS
        self._rows = rows
        self._chunks = chunks
        self._counts = counts
        self._summaries = summaries
        self._ordered: list[RecordRow] | None = None
        """The rows in chunk order, once laid out here (not for rows read from the memo)."""
        self._material = material
        self.reread = reread

    @classmethod
    def of(cls, rows: list[RecordRow]) -> RecordRows:
        return cls(len(rows), rows=rows)

    def __len__(self) -> int:
        return self.count

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RecordRows) and sorted(self.rows()) == sorted(other.rows())

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"RecordRows({self.count} rows)"

    def rows(self) -> list[RecordRow]:
        """Every row (in chunk order once unpacked from the memo)."""
        if self._rows is None:
            try:
                self._rows = [row for chunk in self.chunks() for row in unpack_chunk(chunk)]
            except ValueError:
                if self.reread is None:
                    raise
                self._rows = self.reread()
        return self._rows

    def _lay_out(self) -> tuple[list[RecordRow], list[int], list[Summary | None]]:
        """:func:`layout` of the rows (given, or read again after a corrupt chunk)."""
        if self._ordered is None or self._counts is None or self._summaries is None:
            source = self._rows if self._rows is not None else (
                self.reread() if self.reread is not None else self.rows())
            self._ordered, self._counts, self._summaries = layout(source, self.size)
        return self._ordered, self._counts, self._summaries

    def chunks(self) -> list[bytes]:
        """The rows in checksummed chunks (packed once)."""
        if self._chunks is None:
            ordered, counts, _ = self._lay_out()
            starts = itertools.accumulate(counts, initial=0)
            self._chunks = [pack_chunk(ordered[start:start + n])
                            for start, n in zip(starts, counts, strict=False)]
        return self._chunks

    def chunk_sizes(self) -> list[int]:
        """The row count of each chunk."""
        return self._counts if self._counts is not None else self._lay_out()[1]

    def chunk_summary(self, number: int) -> Summary | None:
        """The summary of chunk ``number``, if it holds header rows only."""
        return (self._summaries if self._summaries is not None else self._lay_out()[2])[number]

    def chunk_rows(self, number: int) -> list[RecordRow]:
        """The rows of chunk ``number`` (all rows are parsed again if it is corrupt)."""
        if self._ordered is None and self._chunks is not None:
            try:
                return unpack_chunk(self._chunks[number])
            except ValueError:
                pass
        ordered, counts, _ = self._lay_out()
        start = sum(counts[:number])
        return ordered[start:start + counts[number]]

    def py_material(self) -> bytes:
        """:func:`py_material` of the rows (computed once, or kept by the memo)."""
        if self._material is None:
            self._material = py_material(self.rows())
        return self._material

    def packed(self) -> tuple[Any, ...]:
        """As the memo file stores it: (rows, rows a chunk, chunks, each chunk's row count,
        each chunk's summary, :meth:`py_material`)."""
        chunks = self.chunks()
        summaries = self._summaries if self._summaries is not None else self._lay_out()[2]
        return (self.count, self.size, chunks, self.chunk_sizes(), summaries,
                self.py_material())

    @classmethod
    def unpacked(cls, value: Any, reread: Callable[[], list[RecordRow]] | None = None
                 ) -> RecordRows:
        """:meth:`packed` back; ValueError for a value of another shape."""
        if not (type(value) is tuple and len(value) == 6 and type(value[0]) is int
                and type(value[1]) is int and value[1] > 0 and type(value[5]) is bytes):
            raise ValueError("not packed RECORD rows")
        count, size, chunks, counts, summaries, material = value
        if not (type(chunks) is list and type(counts) is list and type(summaries) is list
                and len(chunks) == len(counts) == len(summaries)
                and all(type(c) is bytes for c in chunks)
                and all(type(n) is int and 0 < n <= size for n in counts)
                and sum(counts) == count
                and all(s is None or _is_summary(s, n) for s, n in zip(summaries, counts,
                                                                        strict=True))):
            raise ValueError("not packed RECORD rows")
        return cls(count, chunks=chunks, counts=counts, summaries=summaries,
                   material=material, size=size, reread=reread)


def _is_summary(value: Any, rows: int) -> bool:
    return (type(value) is tuple and all(
        type(p) is tuple and len(p) == 2 and type(p[0]) is str and type(p[1]) is int
        and p[1] > 0 for p in value) and sum(p[1] for p in value) == rows)
