"""Reading a file bounded: an input document, or a file inside an environment or a cache.

Every JSON or TOML file envguard is given is read by :func:`read_input`: regular files only
(a FIFO would block forever, ``/dev/zero`` would be read until memory runs out), and at most
:data:`MAX_INPUT_BYTES` (docs/CLI.md, "Input limits"). Anything else is an
:class:`~envguard.errors.InputError` (exit 2) of one line that names the file.

Every file envguard reads inside an environment or a cache (a dist-info's METADATA, RECORD,
WHEEL, INSTALLER, direct_url.json, entry_points.txt, ``torch/version.py``,
``conda-meta/``, a memo file) is read by :func:`read_bounded`, with the same rules and a cap
per kind (:data:`RECORD_BYTES`, :data:`METADATA_BYTES`, :data:`SMALL_FILE_BYTES`): one
``open`` (``O_NONBLOCK``, so a FIFO cannot block it), one ``fstat`` of the open descriptor
and the reads, at most cap + 1 bytes. Symlinks are followed, as Python follows them; what
they lead to must be a regular file within the cap. The caller turns a
:class:`NotReadable` into a one-line finding and carries on (docs/SNAPSHOT.md, "Files
inside the environment").

A file of any length read as a stream (a training data file, line by line) is opened by
:func:`open_stream`, the same way; :func:`not_regular` says, from a ``stat`` alone, why a
path that a library will open itself (a model folder's files) is not a regular file.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import BinaryIO

from envguard.errors import InputError

__all__ = ["LINK_REFUSAL", "MAX_INPUT_BYTES", "METADATA_BYTES", "RECORD_BYTES", "SMALL_FILE_BYTES",
           "NotReadable", "not_regular", "open_stream", "oserror_reason", "read_bounded",
           "read_bounded_text", "read_head", "read_input", "read_input_text", "read_range"]

MAX_INPUT_BYTES = 256 << 20
"""256 MiB: the largest snapshot, lockfile or other single input document envguard reads."""
RECORD_BYTES = 64 << 20
"""64 MiB: a RECORD, or a conda-meta record (the largest seen, CUDA torch's RECORD, is 1.3 MB
for 12,253 rows: 50 times less)."""
METADATA_BYTES = 16 << 20
"""16 MiB: a METADATA or PKG-INFO (long descriptions included: the largest seen is 0.15 MB),
``conda-meta/history``, ``entry_points.txt``."""
SMALL_FILE_BYTES = 1 << 20
"""1 MiB: INSTALLER, WHEEL, direct_url.json, ``torch/version.py`` (each a few hundred bytes)."""

_CHUNK = 1 << 20
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
LINK_REFUSAL = ("is a symbolic link; envguard does not follow links in its own state "
                "(.envguard/, a lock's snapshots): remove it")
_OPEN = (os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
         | getattr(os, "O_NOCTTY", 0))


class NotReadable(InputError):
    """A file that is there but is not read: not a regular file, too large, a symlink loop,
    unreadable. ``reason`` says why in a few words, without the path."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


def _kind(st_mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(st_mode):
            return name
    return "not a regular file"


def _refusal(st: os.stat_result, what: str, limit: int) -> str | None:
    """Why a file of this ``stat`` is not read as a ``what``, or None."""
    if stat.S_ISREG(st.st_mode):
        if st.st_size > limit:
            return f"too large for a {what} ({st.st_size:,} bytes; the limit is {limit:,})"
        return None
    if stat.S_ISDIR(st.st_mode):
        return f"is a folder, not a {what}"
    return (f"is {_kind(st.st_mode)}, not a regular file (a {what} is read from a regular "
            "file only)")


def oserror_reason(exc: OSError) -> str:
    """``exc`` in a few words, for a one-line finding (a symlink loop named as such)."""
    if exc.errno == errno.ELOOP:
        return "is a symlink loop (too many levels of symbolic links)"
    return f"cannot read: {exc.strerror or exc}"


def _read_fd(fd: int, name: str, what: str, limit: int) -> bytes:
    """The rest of an open file: checked on the descriptor, read until EOF or past ``limit``
    (it may grow meanwhile; a file of ``/proc`` says size 0 and is still read)."""
    st = os.fstat(fd)
    reason = _refusal(st, what, limit)
    if reason is not None:
        raise NotReadable(name, reason)
    chunks: list[bytes] = []
    total = 0
    want = max(st.st_size + 1, 1 << 16)  # usually the whole file in one read, then EOF
    while total <= limit:
        chunk = os.read(fd, min(want, limit + 1 - total))
        if not chunk:
            break
        chunks.append(chunk)
        total += len(chunk)
        want = _CHUNK
    if total > limit:
        raise NotReadable(name, f"too large for a {what} (more than {limit:,} bytes)")
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _open(name: str, follow: bool) -> int:
    """The one open every reader here makes: ``O_NONBLOCK`` (a FIFO with no writer does not
    block it); ``follow=False`` refuses a symlink as the last component. FileNotFoundError
    when ``name`` or a folder on the way is not there, :class:`NotReadable` otherwise."""
    try:
        return os.open(name, _OPEN if follow else _OPEN | _NOFOLLOW)
    except (FileNotFoundError, NotADirectoryError):
        raise FileNotFoundError(errno.ENOENT, "no such file", name) from None
    except OSError as exc:
        if not follow and exc.errno == errno.ELOOP and os.path.islink(name):
            raise NotReadable(name, LINK_REFUSAL) from None
        raise NotReadable(name, oserror_reason(exc)) from None


def read_bounded(path: str | os.PathLike[str], *, limit: int, what: str = "file",
                 follow: bool = True) -> bytes:
    """The bytes of the regular file ``path`` (symlinks followed), at most ``limit``: for a
    file inside an environment, a cache or envguard's memo folder. ``follow=False``: a
    symlink as the last component is refused (:data:`LINK_REFUSAL`), for envguard's own
    state, where a planted link could point anywhere.

    One ``open`` with ``O_NONBLOCK`` (a FIFO with no writer does not block it), one ``fstat``
    of the descriptor, the reads. FileNotFoundError when ``path`` (or a folder on the way)
    is not there; :class:`NotReadable` when it is a folder, a FIFO, a device, a socket, a
    symlink loop, larger than ``limit`` or unreadable.
    """
    name = os.fspath(path)
    fd = _open(name, follow)
    try:
        return _read_fd(fd, name, what, limit)
    except OSError as exc:
        raise NotReadable(name, oserror_reason(exc)) from None
    finally:
        os.close(fd)


def read_head(path: str | os.PathLike[str], size: int) -> bytes:
    """The first ``size`` bytes of the regular file ``path`` (a script's shebang, say),
    whatever its length: the same open as :func:`read_bounded` (a FIFO or a device on
    PATH neither blocks nor streams), :class:`NotReadable` for anything not a regular file."""
    name = os.fspath(path)
    try:
        fd = os.open(name, _OPEN)
    except OSError as exc:
        raise NotReadable(name, oserror_reason(exc)) from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotReadable(name, "is not a regular file")
        return os.read(fd, size)
    except OSError as exc:
        raise NotReadable(name, oserror_reason(exc)) from None
    finally:
        os.close(fd)


def read_range(path: str | os.PathLike[str], offset: int, length: int, *,
               follow: bool = True) -> bytes:
    """``length`` bytes of the regular file ``path`` from ``offset`` (fewer at its end):
    the same open as :func:`read_bounded`, one ``pread``. :class:`NotReadable` for anything
    not a regular file; ``follow=False`` refuses a symlink (:data:`LINK_REFUSAL`)."""
    name = os.fspath(path)
    fd = _open(name, follow)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotReadable(name, _refusal(st, "file", 0) or "is not a regular file")
        return os.pread(fd, length, offset)
    except OSError as exc:
        raise NotReadable(name, oserror_reason(exc)) from None
    finally:
        os.close(fd)


def open_stream(path: str | os.PathLike[str]) -> BinaryIO:
    """The regular file ``path`` (symlinks followed), open for reading as a stream of any
    length (a data file of gigabytes, read line by line): the same open as
    :func:`read_bounded`, so a FIFO neither blocks it nor a device streams into it.
    FileNotFoundError when it is not there, :class:`NotReadable` when it is not a regular
    file or cannot be read."""
    name = os.fspath(path)
    fd = _open(name, follow=True)
    try:
        reason = _not_regular(os.fstat(fd).st_mode)
        if reason is not None:
            raise NotReadable(name, reason)
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def not_regular(path: str | os.PathLike[str]) -> str | None:
    """Why ``path`` (symlinks followed) is there but is not a regular file, a few words
    (a FIFO, a device, a socket, a folder); None for a regular file or nothing there. A
    ``stat`` only: nothing is opened, so it cannot block."""
    try:
        return _not_regular(os.stat(path).st_mode)
    except OSError:
        return None


def _not_regular(st_mode: int) -> str | None:
    """Why a file of this mode is not a regular file, in a few words; None for one."""
    if stat.S_ISREG(st_mode):
        return None
    if stat.S_ISDIR(st_mode):
        return "is a folder, not a file"
    return f"is {_kind(st_mode)}, not a regular file"


def read_bounded_text(path: str | os.PathLike[str], *, limit: int,
                      what: str = "file") -> str:
    """:func:`read_bounded` decoded as UTF-8, invalid bytes replaced (U+FFFD): what
    ``open(path, errors="replace")`` gave before, bounded."""
    return read_bounded(path, limit=limit, what=what).decode("utf-8", "replace")


def read_input(path: str | os.PathLike[str], *, what: str = "file",
               limit: int = MAX_INPUT_BYTES, follow: bool = True) -> bytes:
    """The bytes of the regular file ``path``, at most ``limit`` of them.

    ``what`` names the document in errors (``snapshot``, ``lockfile``). InputError when it
    is missing, unreadable, a folder, not a regular file, or larger than ``limit``. The
    file is checked before it is opened (a device is never opened) and again once open
    (it cannot be swapped in between), and the read stops past ``limit`` even if the
    file grows meanwhile.
    """
    name = str(path)
    try:
        st = os.stat(path) if follow else os.lstat(path)
        if stat.S_ISLNK(st.st_mode):
            raise NotReadable(name, LINK_REFUSAL)
        reason = _refusal(st, what, limit)
        if reason is not None:
            raise NotReadable(name, reason)
        return read_bounded(path, limit=limit, what=what, follow=follow)
    except FileNotFoundError:
        raise InputError(f"{name}: no such file") from None
    except OSError as exc:
        raise NotReadable(name, oserror_reason(exc)) from None


def read_input_text(path: str | os.PathLike[str] | Path, *, what: str = "file",
                    limit: int = MAX_INPUT_BYTES, follow: bool = True) -> str:
    """:func:`read_input` decoded as UTF-8; InputError naming the file when it is not."""
    raw = read_input(path, what=what, limit=limit, follow=follow)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise InputError(f"{path}: not a {what} (not UTF-8 text)") from None
