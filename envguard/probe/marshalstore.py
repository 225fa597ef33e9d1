"""Small private caches on disk, in ``marshal`` format.

``marshal`` loads tens of thousands of tuples in a few milliseconds, where JSON
takes tens of milliseconds; it runs no code (unlike pickle). Each file carries a
format tag that includes ``marshal.version``; a file that is unreadable, corrupt
or of another format is ignored, which only makes that run slower.
"""

from __future__ import annotations

import contextlib
import marshal
import os
import tempfile
from pathlib import Path
from typing import Any


def load(path: Path, tag: tuple[Any, ...]) -> tuple[dict[Any, Any], str | None]:
    """(entries, note): the cached dict, empty when absent or unusable; a note says why."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return {}, None
    except OSError as exc:
        return {}, f"cache {path} ignored: {exc.strerror or exc}"
    try:
        doc = marshal.loads(data)  # noqa: S302 - our own cache file; marshal runs no code
    except (ValueError, EOFError, TypeError) as exc:
        return {}, f"cache {path} ignored: {exc}"
    if isinstance(doc, tuple) and len(doc) == 2 and doc[0] == (*tag, marshal.version) \
            and isinstance(doc[1], dict):
        return doc[1], None
    return {}, None


def save(path: Path, tag: tuple[Any, ...], entries: dict[Any, Any]) -> str | None:
    """Write atomically; return an error message instead of raising."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as fh:
                marshal.dump(((*tag, marshal.version), entries), fh)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
    except OSError as exc:
        return f"cannot write {path}: {exc.strerror or exc}"
    return None
