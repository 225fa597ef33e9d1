"""Tar files of a cache tree: writing without following links out of the tree, checking
every member before anything is extracted, extracting with tarfile's ``data`` filter, and
swapping the result into place atomically. Used by :mod:`envguard.cache.store`.

An archive is opened without waiting (a FIFO or device named as one is refused at once),
and what its headers announce is bounded before a byte is extracted: at most MAX_MEMBERS
members and :func:`restore_cap` bytes (90% of the free space where it is restored, at
most MAX_RESTORE_BYTES); the extraction counts the bytes again as it goes, so an archive
that reads differently the second time stops at the same bound."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import stat
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from envguard.errors import InputError, OutputError

_CHUNK = 1 << 20
MAX_MEMBERS = 1_000_000
"""Members of one archive (a warm inductor cache holds thousands)."""
MAX_RESTORE_BYTES = 1 << 40
"""Bytes one archive may announce, whatever the free space (1 TiB)."""
FREE_SHARE = 0.9
"""The share of the free space where a cache is restored that its archive may fill."""

class HashingWriter:
    """A write-only file that hashes and counts what passes through it."""

    def __init__(self, fh: BinaryIO) -> None:
        self._fh = fh
        self.sha = hashlib.sha256()
        self.size = 0

    def write(self, data: bytes) -> int:
        self.sha.update(data)
        self.size += len(data)
        return self._fh.write(data)

    def tell(self) -> int:
        return self.size

    def flush(self) -> None:
        self._fh.flush()


def _inside(target: str) -> bool:
    """Whether a symlink target is relative and only descends (no ``..``): such a link,
    or any chain of them, cannot leave the cache. Judged on the text: never followed."""
    return not os.path.isabs(target) and ".." not in target.split("/")


def _walk(root: str, skipped: list[str]) -> Iterator[tuple[str, str, os.stat_result]]:
    """(path, archive name, lstat) of every folder, file and in-tree symlink, sorted.

    Never follows a symlink, so a loop cannot hang it; sockets, fifos and devices
    are skipped and named in ``skipped``.
    """
    stack = [(root, ".")]
    while stack:
        folder, arc = stack.pop()
        try:
            with os.scandir(folder) as it:
                entries = sorted(it, key=lambda e: e.name, reverse=True)
        except OSError as exc:
            raise InputError(f"cannot read {folder}: {exc.strerror or exc}") from None
        for e in entries:
            name = e.name if arc == "." else f"{arc}/{e.name}"
            try:
                st = e.stat(follow_symlinks=False)
            except FileNotFoundError:
                skipped.append(f"{name} (vanished)")
                continue
            if stat.S_ISDIR(st.st_mode):
                yield e.path, name, st
                stack.append((e.path, name))
            elif stat.S_ISREG(st.st_mode):
                yield e.path, name, st
            elif stat.S_ISLNK(st.st_mode):
                if _inside(os.readlink(e.path)):
                    yield e.path, name, st
                else:
                    skipped.append(f"{name} (symlink leaving its folder)")
            else:
                skipped.append(f"{name} (not a file: socket, fifo or device)")


def _whole_seconds(info: tarfile.TarInfo) -> tarfile.TarInfo:
    """A fractional mtime costs every member a PAX header: restores parse twice as many."""
    info.mtime = int(info.mtime)
    return info


def add_tree(tar: tarfile.TarFile, root: str, skipped: list[str]) -> tuple[int, int]:
    top = tarfile.TarInfo(".")  # the folder itself, also where root is a symlink to it
    st = os.stat(root)
    top.type, top.mode, top.mtime = tarfile.DIRTYPE, stat.S_IMODE(st.st_mode), int(st.st_mtime)
    tar.addfile(top)
    files = total = 0
    for path, name, st in _walk(root, skipped):
        if not stat.S_ISREG(st.st_mode):
            tar.addfile(_whole_seconds(tar.gettarinfo(path, arcname=name)))
            continue
        try:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0)
                         | getattr(os, "O_NONBLOCK", 0))
        except FileNotFoundError:
            skipped.append(f"{name} (vanished)")
            continue
        except OSError as exc:
            raise InputError(f"cannot read {path}: {exc.strerror or exc}") from None
        with os.fdopen(fd, "rb") as fh:
            info = _whole_seconds(tar.gettarinfo(arcname=name, fileobj=fh))
            if not info.isreg() and not info.islnk():
                skipped.append(f"{name} (changed while saving)")
                continue
            try:
                tar.addfile(info, fh if info.isreg() else None)
            except OSError as exc:
                raise InputError(f"{path} changed while it was saved ({exc}); save again")\
                    from None
            files += 1
            total += info.size if info.isreg() else st.st_size
    return files, total


def fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)



# -- safe extraction ---------------------------------------------------------------------

def open_archive(path: Path) -> BinaryIO:
    """``path`` opened for reading without blocking on a FIFO; InputError (exit 2) unless it
    is a regular file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise InputError(f"{path}: not a regular file (a FIFO, device or folder); "
                         "nothing restored")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def restore_cap(target: str) -> int:
    """The most bytes an archive restored at ``target`` may announce (see the module)."""
    where = os.path.abspath(target)
    while not os.path.isdir(where) and os.path.dirname(where) != where:
        where = os.path.dirname(where)
    try:
        st = os.statvfs(where)
    except OSError:
        return MAX_RESTORE_BYTES
    return min(MAX_RESTORE_BYTES, int(st.f_bavail * st.f_frsize * FREE_SHARE))


@contextlib.contextmanager
def _open_tar(path: Path) -> Iterator[tarfile.TarFile]:
    with open_archive(path) as fh, (
            tarfile.open(fileobj=fh, mode="r:gz") if path.name.endswith(".gz")
            else tarfile.open(fileobj=fh, mode="r:")) as tar:
        yield tar


class _Budget:
    """Members and bytes announced so far, against the caps; InputError once past them."""

    def __init__(self, path: Path, cap: int) -> None:
        self.path, self.cap, self.members, self.bytes = path, cap, 0, 0

    def take(self, m: tarfile.TarInfo) -> None:
        self.members += 1
        self.bytes += m.size if m.isreg() else 0
        if self.members > MAX_MEMBERS:
            raise InputError(f"{self.path}: more than {MAX_MEMBERS:,} members; nothing "
                             "restored")
        if self.bytes > self.cap:
            raise InputError(f"{self.path}: its members announce more than {self.cap:,} "
                             "bytes (90% of the free space where it is restored, at most "
                             "1 TiB); nothing restored")


def _member_problem(m: tarfile.TarInfo, seen: dict[str, tarfile.TarInfo]) -> str | None:
    """Why a member must not be extracted, on top of tarfile's own ``data`` filter
    (which older 3.11/3.12 releases let through with symlink chains)."""
    if m.name.startswith("/") or os.path.isabs(m.name):
        return "absolute path"
    parts = [p for p in m.name.split("/") if p not in ("", ".")]
    if ".." in parts:
        return "'..' in the path"
    if not parts:
        return None if m.isdir() else "the top is not a folder"
    key = "/".join(parts)
    if key in seen:
        return "listed twice"
    for i in range(1, len(parts)):
        parent = seen.get("/".join(parts[:i]))
        if parent is not None and not parent.isdir():
            return "below a symlink or file"
    if m.issym():
        if not _inside(m.linkname):
            return f"symlink to {m.linkname!r}, absolute or with '..'"
    elif m.islnk():
        target = seen.get("/".join(p for p in m.linkname.split("/") if p not in ("", ".")))
        if target is None or not target.isreg():
            return f"hard link to {m.linkname!r}, not a file of the cache"
    elif not (m.isreg() or m.isdir()):
        return "device, fifo or other special file"
    seen[key] = m
    return None


def check_members(path: Path, cap: int = MAX_RESTORE_BYTES) -> int:
    """Read every member header; InputError naming the first unsafe one, or once the
    members announce more than ``cap`` bytes or MAX_MEMBERS members. Returns the number
    of files."""
    seen: dict[str, tarfile.TarInfo] = {}
    files = 0
    budget = _Budget(path, cap)
    try:
        with _open_tar(path) as tar:
            for m in tar:
                budget.take(m)
                problem = _member_problem(m, seen)
                if problem:
                    raise InputError(f"{path}: refusing unsafe member {m.name!r} ({problem}); "
                                     "nothing restored")
                files += m.isreg() or m.islnk()
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise InputError(f"{path}: not a readable tar ({exc}); nothing restored") from None
    return files


def _keep_modes(member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo | None:
    """tarfile's ``data`` filter, but folders keep their modes (minus group/other write)."""
    safe = tarfile.data_filter(member, dest)
    if safe is not None and member.isdir():
        return safe.replace(mode=(member.mode & 0o755) | 0o700, deep=False)
    return safe


def extract_into(path: Path, staging: str, cap: int = MAX_RESTORE_BYTES) -> None:
    """Extract a checked tar into the new folder ``staging``, counting again: InputError
    before the member that would pass ``cap`` bytes or MAX_MEMBERS members."""
    if not hasattr(tarfile, "data_filter"):
        raise InputError("restoring needs Python 3.10.12, 3.11.4 or later "
                         "(tarfile extraction filters)")
    try:
        os.makedirs(os.path.dirname(staging), exist_ok=True)
        os.mkdir(staging, 0o700)
        budget = _Budget(path, cap)

        def counted(member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo | None:
            budget.take(member)
            return _keep_modes(member, dest)

        with _open_tar(path) as tar:
            # Members were checked (check_members); the filter checks them again.
            tar.extractall(staging, filter=counted)  # noqa: S202
    except tarfile.TarError as exc:
        raise InputError(f"{path}: refused while extracting: {exc}; not restored") from None
    except OSError as exc:
        raise OutputError(f"cannot extract into {staging}: {exc.strerror or exc}; "
                          "not restored") from None


def _exchange(a: str, b: str) -> bool:
    """Swap two paths in one step (Linux ``renameat2(RENAME_EXCHANGE)``); False where the
    system or filesystem cannot."""
    import ctypes

    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    at_fdcwd, rename_exchange = -100, 2
    if fn(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), b)


def _free_name(base: str) -> str:
    name, n = base, 1
    while os.path.lexists(name):
        name, n = f"{base}-{n}", n + 1
    return name


def swap_into_place(staging: str, target: str, stamp: str) -> str | None:
    """Put ``staging`` at ``target``; the previous non-empty ``target`` is kept (returned)."""
    try:
        if not os.path.lexists(target):
            with contextlib.suppress(FileExistsError, OSError):
                os.rename(staging, target)  # fails only if the folder appeared meanwhile
                return None
        backup = _free_name(f"{target}.before-restore-{stamp}")
        if _exchange(staging, target):
            os.rename(staging, backup)  # staging now holds the previous cache
        else:
            os.rename(target, backup)
            try:
                os.rename(staging, target)
            except OSError:
                os.rename(backup, target)
                raise
    except OSError as exc:
        raise OutputError(f"cannot move the restored cache into {target}: "
                          f"{exc.strerror or exc}") from None
    if os.path.isdir(backup) and not os.path.islink(backup) and not os.listdir(backup):
        os.rmdir(backup)  # an empty folder: nothing to keep
        return None
    return backup
