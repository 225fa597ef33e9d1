"""Atomic file writes: a temporary file in the same folder, fsync, then rename.

A reader sees either the old file or the complete new one, never a half-written
one; an interrupted write leaves the old file intact and no temporary behind.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

from envguard.errors import OutputError


def write_text_atomic(path: str | os.PathLike[str], text: str, *, mode: int = 0o644) -> Path:
    """Write ``text`` to ``path`` atomically and return the path.

    Raises :class:`OutputError` (one line, no traceback material) when the folder
    cannot be created or written.
    """
    return write_bytes_atomic(path, text.encode("utf-8"), mode=mode)


def write_bytes_atomic(path: str | os.PathLike[str], data: bytes, *, mode: int = 0o644) -> Path:
    """Write ``data`` to ``path`` atomically and return the path (see write_text_atomic)."""
    target = Path(path)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    except OSError as exc:
        raise OutputError(f"cannot write {target}: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp_name, mode)
        os.replace(tmp_name, target)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp_name)
        if isinstance(exc, OSError):
            raise OutputError(f"cannot write {target}: {exc.strerror or exc}") from None
        raise
    return target
