"""Writing a result to a path: atomically where the path is a file, through where it is not.

What the path is decides how it is written (every writer of envguard comes here):

- a regular file, or nothing yet: a temporary file in the same folder, fsync, then rename.
  A reader sees either the old file or the complete new one, never a half-written one; an
  interrupted write leaves the old file intact and no temporary behind. An existing file
  keeps its permission bits (a 0600 snapshot stays 0600; as root, its owner too); a new
  file gets 0666 less the umask, as ``open()`` would give it.
- a symlink (or a chain of them) to a regular file or to nothing: the file it points to is
  replaced, atomically as above; the link stays a link.
- a character device (``/dev/null``, a terminal) or a FIFO: written through (opened and
  written, no temporary, no rename), so ``-o /dev/null`` never replaces the device. A FIFO
  waits up to FIFO_READER_WAIT_S (60 s) for a reader to open it, then fails. So is
  a descriptor link: ``/dev/stdout``, ``/dev/fd/N``, ``/proc/self/fd/N`` write to that
  descriptor (appending, when it is a file).
- a folder, a block device or a socket: :class:`OutputError` (exit 5), nothing written.

envguard's own state (``state_root=``: run records, stored snapshots, lockfiles and their
snapshots, memo files) is written differently: nothing is followed. Every folder from
``state_root`` down to the file is opened with ``O_NOFOLLOW`` (made if missing), and a
link there, or a final name that is a link or anything but a regular file, is an
:class:`OutputError` (exit 5) before anything is written: a link a cloned repository
or another user planted is never written through, nor its target's mode changed.

SIGINT, SIGTERM and SIGHUP during the write remove the temporary file. SIGTERM and SIGHUP
are caught only while the temporary exists, only in the main thread, and only when their
handler is the default one (a caller's own handler, or SIG_IGN, is left alone and runs as
usual); after the clean-up the process dies of the signal, as it would have without it. A
temporary that a ``kill -9`` left (``.NAME.<8 hex>.tmp``) is removed by the next state
write into its folder once older than STALE_TEMP_S (:func:`sweep_stale_temps`).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import signal
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

from envguard.errors import OutputError
from envguard.paths import make_folder

__all__ = ["check_state_path", "sweep_stale_temps", "write_bytes_atomic", "write_text_atomic"]

_FD_DIR = re.compile(r"/proc/(?P<pid>[^/]+)/(?:task/[^/]+/)?fd")
"""The folder of a descriptor link, once resolved (``/dev/fd`` is ``/proc/self/fd``)."""
_MAX_LINKS = 40
_CHUNK = 1 << 30
_OPEN_TMP = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0) \
    | getattr(os, "O_NOFOLLOW", 0)
_CLEANED_SIGNALS = tuple(getattr(signal, n) for n in ("SIGTERM", "SIGHUP") if hasattr(signal, n))
_OPEN_DIR = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0)
_TEMP_NAME = re.compile(r"\..+\.[0-9a-f]{8}\.tmp")
"""The name of a temporary :func:`_replace` makes (``.NAME.<8 hex>.tmp``)."""
STALE_TEMP_S = 3600.0
"""A temporary older than this was left by a killed process (a write takes seconds)."""
_SWEPT: set[tuple[int, int]] = set()
"""Folders (device, inode) already swept by this process."""
FIFO_READER_WAIT_S = 60.0
"""How long a write into a FIFO waits for a reader (a FIFO nobody reads would block forever)."""


def write_text_atomic(path: str | os.PathLike[str], text: str, *,
                      mode: int | None = None,
                      state_root: str | os.PathLike[str] | None = None) -> Path:
    """Write ``text`` (UTF-8) to ``path`` and return the path (see the module docstring).

    ``mode``: the permission bits of the result; None keeps an existing file's, or gives a
    new one 0666 less the umask. Raises :class:`OutputError` (one line) when the path cannot
    be written; any previous file is then left untouched. ``state_root``: the path is
    envguard's own state below that folder, written without following any link.
    """
    return write_bytes_atomic(path, text.encode("utf-8"), mode=mode, state_root=state_root)


def write_bytes_atomic(path: str | os.PathLike[str], data: bytes, *,
                       mode: int | None = None, durable: bool = True,
                       state_root: str | os.PathLike[str] | None = None) -> Path:
    """Write ``data`` to ``path`` and return the path (see write_text_atomic).

    ``durable=False`` skips the fsync before the rename: for a file whose loss after a
    crash costs only time (envguard's memo files), the rename is still atomic."""
    target = Path(path)
    if state_root is not None:
        folder = _state_folder(target, Path(state_root), create=True)
        try:
            old = _state_file(target, folder)
            _sweep(folder)
            _replace(target, folder, target.name, data, mode, old, durable)
        finally:
            os.close(folder)
        return target
    return _write_user_path(target, data, mode, durable)


def _write_user_path(target: Path, data: bytes, mode: int | None, durable: bool) -> Path:
    kind, where = _destination(target)
    if kind == "descriptor":
        _write_through(target, _open_descriptor(target, where), data)
        return target
    try:
        st: os.stat_result | None = os.lstat(where)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise OutputError(f"cannot write {target}: {exc.strerror or exc}") from None
    if st is None or stat.S_ISREG(st.st_mode):
        folder = _state_folder(Path(where), Path(where).parent, create=True)
        try:
            _replace(target, folder, os.path.basename(where), data, mode, st, durable)
        finally:
            os.close(folder)
    elif stat.S_ISFIFO(st.st_mode):
        _write_through(target, _open_fifo(target, where), data)
    elif stat.S_ISCHR(st.st_mode):
        _write_through(target, _open(target, where, os.O_WRONLY), data)
    elif stat.S_ISDIR(st.st_mode):
        raise OutputError(f"cannot write {target}: is a folder")
    else:
        raise OutputError(f"cannot write {target}: it is a {_kind(st.st_mode)}, not a regular "
                          "file, FIFO or character device; refusing to replace it")
    return target


def _kind(st_mode: int) -> str:
    return "block device" if stat.S_ISBLK(st_mode) else \
        "socket" if stat.S_ISSOCK(st_mode) else "special file"


def _destination(target: Path) -> tuple[str, str]:
    """("descriptor", link) for a descriptor link, else ("path", the path with every symlink
    of the chain followed: what to replace, or to create)."""
    current = os.path.abspath(target)
    for _ in range(_MAX_LINKS):
        folder = os.path.realpath(os.path.dirname(current))
        current = os.path.join(folder, os.path.basename(current))
        if _FD_DIR.fullmatch(folder):
            return "descriptor", current
        try:
            link = os.readlink(current)
        except OSError:  # not a symlink, or nothing there yet
            return "path", current
        current = os.path.normpath(os.path.join(folder, link))
    raise OutputError(f"cannot write {target}: too many levels of symbolic links")


def _open(target: Path, path: str, flags: int) -> int:
    try:
        return os.open(path, flags | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise OutputError(f"cannot write {target}: {exc.strerror or exc}") from None


def _open_fifo(target: Path, path: str) -> int:
    """The FIFO opened for writing once a reader has it open (ENXIO until then), blocking."""
    deadline = time.monotonic() + FIFO_READER_WAIT_S
    while True:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        except OSError as exc:
            if exc.errno != errno.ENXIO:
                raise OutputError(f"cannot write {target}: {exc.strerror or exc}") from None
            if time.monotonic() > deadline:
                raise OutputError(f"cannot write {target}: no process opened the FIFO for "
                                  f"reading within {FIFO_READER_WAIT_S:g} s") from None
            time.sleep(0.02)
            continue
        os.set_blocking(fd, True)
        return fd


def _open_descriptor(target: Path, link: str) -> int:
    """A descriptor of our own is duplicated (it may be a socket or a pipe that cannot be
    opened again); another process's is opened through its link, appending."""
    match = _FD_DIR.fullmatch(os.path.dirname(link))
    number = os.path.basename(link)
    if match and match.group("pid") in ("self", "thread-self", str(os.getpid())) \
            and number.isdigit():
        try:
            return os.dup(int(number))
        except OSError as exc:
            raise OutputError(f"cannot write {target}: {exc.strerror or exc}") from None
    return _open(target, link, os.O_WRONLY | os.O_APPEND)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view[:_CHUNK])
        view = view[n:]


def _write_through(target: Path, fd: int, data: bytes) -> None:
    """Write into what ``fd`` is (a device, a FIFO, a descriptor): no temporary, no rename."""
    try:
        _write_all(fd, data)
    except OSError as exc:
        raise OutputError(f"cannot write {target}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)


def _replace(target: Path, folder: int, name: str, data: bytes, mode: int | None,
             old: os.stat_result | None, durable: bool = True) -> None:
    """Temporary beside ``name`` in the open ``folder``, fsync, rename over it; no
    temporary left on any error."""
    keep = mode if mode is not None else (old.st_mode & 0o777 if old is not None else None)
    tmp: str | None = None
    with _signals_clean_up():
        try:
            while True:
                tmp = f".{name}.{os.urandom(4).hex()}.tmp"
                try:
                    fd = os.open(tmp, _OPEN_TMP, 0o666 if keep is None else 0o600,
                                 dir_fd=folder)
                    break
                except FileExistsError:
                    continue
            try:
                if keep is not None:
                    os.fchmod(fd, keep)
                if old is not None and os.geteuid() == 0 and \
                        (old.st_uid, old.st_gid) != (0, os.getegid()):
                    with contextlib.suppress(OSError):
                        os.fchown(fd, old.st_uid, old.st_gid)
                _write_all(fd, data)
                if durable:
                    os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, name, src_dir_fd=folder, dst_dir_fd=folder)
            tmp = None
        except BaseException as exc:
            if tmp is not None:
                with contextlib.suppress(OSError):
                    os.unlink(tmp, dir_fd=folder)
            if isinstance(exc, OSError):
                raise OutputError(f"cannot write {target}: {exc.strerror or exc}") from None
            raise


def _link_refusal(target: Path, shown: str) -> OutputError:  # one line: exit 5
    return OutputError(f"cannot write {target}: {shown} is a symbolic link; envguard writes "
                       "its own state only into real folders and files, never through a "
                       "link (remove the link)")


def _state_folder(target: Path, root: Path, *, create: bool) -> int:
    """The folder of ``target`` opened, every folder below ``root`` opened with
    ``O_NOFOLLOW`` (made when missing and ``create``; -1 when missing otherwise)."""
    rel = os.path.relpath(os.path.abspath(target.parent), os.path.abspath(root))
    parts = [] if rel == os.curdir else rel.split(os.sep)
    if os.pardir in parts:
        raise OutputError(f"cannot write {target}: not below {root}")
    try:
        if create:
            os.makedirs(root, exist_ok=True)
        fd = os.open(root, _OPEN_DIR)
    except FileNotFoundError:
        return -1
    except OSError as exc:
        raise OutputError(f"cannot write {target}: {root}: {exc.strerror or exc}") from None
    shown = str(root)
    try:
        for part in parts:
            shown = os.path.normpath(os.path.join(shown, part))
            try:
                sub = os.open(part, _OPEN_DIR | getattr(os, "O_NOFOLLOW", 0), dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    os.close(fd)
                    return -1
                make_folder(part, fd)
                sub = os.open(part, _OPEN_DIR | getattr(os, "O_NOFOLLOW", 0), dir_fd=fd)
            os.close(fd)
            fd = sub
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
            raise _link_refusal(target, shown) if os.path.islink(shown) else OutputError(
                f"cannot write {target}: {shown} is not a folder") from None
        raise OutputError(f"cannot write {target}: {shown}: {exc.strerror or exc}") from None
    return fd


def _state_file(target: Path, folder: int) -> os.stat_result | None:
    """The lstat of ``target`` in its open ``folder``; OutputError unless a regular file."""
    try:
        st = os.stat(target.name, dir_fd=folder, follow_symlinks=False)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise OutputError(f"cannot write {target}: {exc.strerror or exc}") from None
    if stat.S_ISLNK(st.st_mode):
        raise _link_refusal(target, str(target))
    if not stat.S_ISREG(st.st_mode):
        raise OutputError(f"cannot write {target}: it is a "
                          f"{'folder' if stat.S_ISDIR(st.st_mode) else _kind(st.st_mode)}, "
                          "not a regular file; refusing to replace it")
    return st


def check_state_path(path: str | os.PathLike[str], state_root: str | os.PathLike[str]) -> None:
    """What a state write of ``path`` would refuse (a link on the way, a special file),
    raised now, before a command writes anything; nothing is made."""
    target = Path(path)
    folder = _state_folder(target, Path(state_root), create=False)
    if folder >= 0:
        try:
            _state_file(target, folder)
        finally:
            os.close(folder)


def _sweep(folder: int, max_age_s: float = STALE_TEMP_S) -> list[str]:
    """Remove, once per process, this user's temporaries (regular files named as
    :func:`_replace` names them) older than ``max_age_s`` in the open ``folder``."""
    try:
        st = os.fstat(folder)
    except OSError:
        return []
    if (st.st_dev, st.st_ino) in _SWEPT:
        return []
    _SWEPT.add((st.st_dev, st.st_ino))
    removed, cutoff = [], time.time() - max_age_s
    try:
        with os.scandir(folder) as entries:
            names = [e.name for e in entries if e.name.endswith(".tmp")
                     and _TEMP_NAME.fullmatch(e.name)]
    except OSError:
        return []
    for name in names:
        with contextlib.suppress(OSError):
            tmp = os.stat(name, dir_fd=folder, follow_symlinks=False)
            if stat.S_ISREG(tmp.st_mode) and tmp.st_uid == os.geteuid() \
                    and tmp.st_mtime < cutoff:
                os.unlink(name, dir_fd=folder)
                removed.append(name)
    return removed


def sweep_stale_temps(folder: str | os.PathLike[str],
                      max_age_s: float = STALE_TEMP_S) -> list[str]:
    """The stale temporaries removed from ``folder`` (not followed if it is a link)."""
    try:
        fd = os.open(folder, _OPEN_DIR | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return []
    try:
        st = os.fstat(fd)
        _SWEPT.discard((st.st_dev, st.st_ino))
        return _sweep(fd, max_age_s)
    finally:
        os.close(fd)


class _Terminated(BaseException):
    """SIGTERM or SIGHUP arrived while a temporary file existed (never escapes this module:
    the process dies of the signal once the temporary is gone)."""


@contextlib.contextmanager
def _signals_clean_up() -> Iterator[None]:
    """While inside: SIGTERM/SIGHUP with their default action raise _Terminated (so that the
    ``except`` above removes the temporary), then the process dies of the first of them."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers can only be set, and only run, in the main thread
        return
    received: list[int] = []

    def on_signal(signum: int, frame: FrameType | None) -> None:
        received.append(signum)
        if len(received) == 1:
            raise _Terminated(signum)

    installed = []
    for sig in _CLEANED_SIGNALS:
        with contextlib.suppress(ValueError, OSError):
            if signal.getsignal(sig) is signal.SIG_DFL:
                signal.signal(sig, on_signal)
                installed.append(sig)
    try:
        yield
    finally:
        for sig in installed:
            with contextlib.suppress(ValueError, OSError):
                if signal.getsignal(sig) is on_signal:
                    signal.signal(sig, signal.SIG_DFL)
        if received:
            signal.raise_signal(received[0])  # now with its default action: the process ends
            raise OutputError(f"interrupted by signal {received[0]}")  # if it was blocked
