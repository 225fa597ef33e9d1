"""Memo files on disk, in ``marshal`` format, and the keys their entries are checked by.

``marshal`` loads tens of thousands of tuples in a few milliseconds, where JSON
takes tens of milliseconds; it runs no code (unlike pickle). Each file carries a
format tag that includes ``marshal.version``; a file that is unreadable, corrupt
or of another format is ignored, which only makes that run slower.
"""

from __future__ import annotations

import hashlib
import marshal
import os
import sys
from pathlib import Path
from typing import Any

from envguard.atomic import write_bytes_atomic
from envguard.errors import OutputError
from envguard.input_file import NotReadable, read_bounded
from envguard.paths import private_folder

MEMO_BYTES = 64 << 20
"""A memo file larger than this is not read (the records memo of a 50,000-file CUDA
environment is about 3 MB)."""
_ALLOW_CODE = sys.version_info >= (3, 13)

Key = tuple[int, int, int, int]
"""(size, mtime_ns, ctime_ns, inode) of a file."""


def stat_key(st: os.stat_result) -> Key:
    return (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)


def prefix_digest(prefix: str) -> str:
    """A short stable name for one environment's memo files."""
    return hashlib.sha256(os.path.realpath(prefix).encode()).hexdigest()[:16]


def load(path: Path, tag: tuple[Any, ...]) -> tuple[dict[Any, Any], str | None]:
    """(entries, note): the memoised dict, empty when absent or unusable; a note says why.
    The file's tag must be ``tag`` and :data:`marshal.version`, nothing between."""
    entries, rest, note = load_extended(path, tag)
    return (entries, note) if rest == () else ({}, note)


def load_extended(path: Path, tag: tuple[Any, ...]
                  ) -> tuple[dict[Any, Any], tuple[Any, ...], str | None]:
    """(entries, rest, note): :func:`load` of a file whose tag may hold more after ``tag``
    (before :data:`marshal.version`); ``rest`` is that more, for the caller to check when it
    can (the records memo's field digest: :mod:`~envguard.probe.fastpath.records`)."""
    if not private_folder(path.parent):
        return {}, (), None  # a folder others could write to: no memo (paths.DISTRUSTED says why)
    try:  # a regular file of at most MEMO_BYTES: a FIFO or /dev/zero here is no memo
        data = read_bounded(path, limit=MEMO_BYTES, what="memo file")
    except FileNotFoundError:
        return {}, (), None
    except NotReadable as exc:
        return {}, (), f"memo file {path} ignored: {exc.reason}"
    try:
        doc = loads(data)
    except (ValueError, EOFError, TypeError, MemoryError) as exc:
        return {}, (), f"memo file {path} ignored: {exc}"
    size = len(tag)
    if type(doc) is tuple and len(doc) == 2 and type(doc[0]) is tuple \
            and len(doc[0]) > size and doc[0][:size] == tag \
            and doc[0][-1] == marshal.version and type(doc[1]) is dict:
        return doc[1], doc[0][size:-1], None
    return {}, (), None


def loads(data: bytes | memoryview) -> Any:
    """``marshal.loads``, refusing code objects where Python can (3.13+: ``allow_code``).

    Nothing loaded is ever run: a memo's values are compared and copied, and each is checked
    for its exact type (``type(x) is tuple``, ``str``, ``int``, ...) where it is used, so a
    value of another type (a code object on older Pythons included) is a miss."""
    if _ALLOW_CODE:
        return marshal.loads(data, allow_code=False)  # type: ignore[call-arg,unused-ignore]  # noqa: S302
    return marshal.loads(data)  # noqa: S302 - our own memo file; marshal runs no code


def save(path: Path, tag: tuple[Any, ...], entries: dict[Any, Any]) -> str | None:
    """Write atomically (:mod:`envguard.atomic`, without the fsync: a memo lost in a crash
    only makes the next run slower); return an error message instead of raising. Nothing
    is written into a folder that is not private, nor through a link."""
    if not private_folder(path.parent):
        return None
    from envguard.probe.fastpath.prune import prune

    prune(path.parent)  # at most once a day: memo files unused for a month go
    try:
        write_bytes_atomic(path, marshal.dumps(((*tag, marshal.version), entries)),
                           mode=0o600, durable=False, state_root=path.parent)
    except OutputError as exc:
        return str(exc)
    except ValueError as exc:  # marshal: an entry of a type it cannot write
        return f"cannot write {path}: {exc}"
    return None
