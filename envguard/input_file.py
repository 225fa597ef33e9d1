"""Reading an input document (a snapshot, a lockfile, a fleet file, a cache manifest), bounded.

Every JSON or TOML file envguard is given is read here: regular files only (a FIFO would
block forever, ``/dev/zero`` would be read until memory runs out), and at most
:data:`MAX_INPUT_BYTES` (docs/CLI.md, "Input limits"). Anything else is an
:class:`~envguard.errors.InputError` (exit 2) of one line that names the file.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from envguard.errors import InputError

__all__ = ["MAX_INPUT_BYTES", "read_input", "read_input_text"]

MAX_INPUT_BYTES = 256 << 20
"""256 MiB: the largest snapshot, lockfile or other single input document envguard reads."""

_CHUNK = 1 << 20
_OPEN = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)


def _kind(st_mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(st_mode):
            return name
    return "not a regular file"


def _check(name: str, st: os.stat_result, what: str, limit: int) -> None:
    if stat.S_ISDIR(st.st_mode):
        raise InputError(f"{name}: is a folder, not a {what}")
    if not stat.S_ISREG(st.st_mode):
        raise InputError(f"{name}: is {_kind(st.st_mode)}, not a regular file "
                         f"(a {what} is read from a regular file only)")
    if st.st_size > limit:
        raise InputError(f"{name}: too large for a {what} ({st.st_size:,} bytes; the limit "
                         f"is {limit:,})")


def read_input(path: str | os.PathLike[str], *, what: str = "file",
               limit: int = MAX_INPUT_BYTES) -> bytes:
    """The bytes of the regular file ``path``, at most ``limit`` of them.

    ``what`` names the document in errors (``snapshot``, ``lockfile``). InputError when it
    is missing, unreadable, a folder, not a regular file, or larger than ``limit``. The
    file is checked before it is opened (a device is never opened) and again once open
    (it cannot be swapped in between), and the read stops past ``limit`` even if the
    file grows meanwhile.
    """
    name = str(path)
    try:
        _check(name, os.stat(path), what, limit)
        fd = os.open(path, _OPEN)
    except FileNotFoundError:
        raise InputError(f"{name}: no such file") from None
    except OSError as exc:
        raise InputError(f"{name}: cannot read: {exc.strerror or exc}") from None
    try:
        _check(name, os.fstat(fd), what, limit)
        chunks: list[bytes] = []
        total = 0
        while total <= limit:
            chunk = os.read(fd, _CHUNK)
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
    except OSError as exc:
        raise InputError(f"{name}: cannot read: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    if total > limit:
        raise InputError(f"{name}: too large for a {what} (more than {limit:,} bytes)")
    return b"".join(chunks)


def read_input_text(path: str | os.PathLike[str] | Path, *, what: str = "file",
                    limit: int = MAX_INPUT_BYTES) -> str:
    """:func:`read_input` decoded as UTF-8; InputError naming the file when it is not."""
    raw = read_input(path, what=what, limit=limit)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise InputError(f"{path}: not a {what} (not UTF-8 text)") from None
