"""Builds envguard kept for ``envguard undo``: where they are, and the wheel made from one.

A distribution's installed build, kept by :mod:`.keep` before an install replaced or removed
it, when uv's cache did not hold it (pip installed it, or ``uv cache clean`` since). Under
envguard's user folder (:func:`envguard.paths.user_dir`):

- ``kept-builds/sha256-<hex>/``, named by the build fingerprint
  (:mod:`envguard.probe.recordfile`): an unpacked wheel. The distribution's files at their
  site-packages paths, its ``*.dist-info`` folder (without INSTALLER, REQUESTED,
  direct_url.json: how it was installed, not what) with a RECORD of what was kept, and
  what it installed outside site-packages as a wheel holds it: ``NAME-VER.data/scripts/``
  (``bin/``, the shebang given back as ``#!python``) and ``NAME-VER.data/data/`` (the
  rest, by its path in the environment).
- ``kept-builds/sha256-<hex>.json`` (``envguard.kept-build/1``): why a build could not be
  kept (a file that no longer matched its RECORD, a copy over the bound), for undo to say.

:func:`wheel_from_kept` zips a kept build into a wheel, as
:func:`envguard.revisions.builds.wheel_from_archive` zips one of uv's archives, checking
every file against the kept RECORD on the way: a file changed since is never installed.
Nothing below the user folder is followed: every folder and file there is opened with
``O_NOFOLLOW`` (a link is a refusal, never a way elsewhere).
"""

from __future__ import annotations

import base64
import errno
import hashlib
import json
import os
import re
import stat
import time
import zipfile
from collections.abc import Sequence
from pathlib import Path

from envguard.errors import OutputError
from envguard.frozen import frozen
from envguard.model import Distribution
from envguard.paths import make_folder, user_dir
from envguard.probe.recordfile import RecordRow, parse_record

KEPT_FOLDER = "kept-builds"
MARKER_SCHEMA = "envguard.kept-build/1"
MARKER_BYTES = 64 << 10
RECORD_LIMIT = 64 << 20
_FINGERPRINT = re.compile(r"sha256:([0-9a-f]{64})")
_DIR = (os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0)
        | getattr(os, "O_NOFOLLOW", 0))
FILE_FLAGS = (os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0)
              | getattr(os, "O_NONBLOCK", 0))
CHUNK = 1 << 20
WEAK = frozenset({"md5", "sha1"})


@frozen
class KeptLookup:
    """What the store holds for one build: the folder, or why there is none to use."""

    folder: str | None
    reason: str = ""


def kept_root() -> Path:
    return user_dir() / KEPT_FOLDER


def key_of(fingerprint: str | None) -> str | None:
    """``sha256-<hex>``, the store's name for a build fingerprint; None for another form."""
    match = _FINGERPRINT.fullmatch(fingerprint or "")
    return f"sha256-{match.group(1)}" if match else None


def info_name(dist: Distribution) -> str | None:
    """The distribution's ``NAME-VER.dist-info`` folder name; None for another kind."""
    info = os.path.basename(dist.metadata_dir.rstrip("/"))
    return info if info.endswith(".dist-info") and info not in (".dist-info",) else None


def open_folder(parts: Sequence[str], *, create: bool) -> int:
    """The folder ``user_dir()/parts...`` opened, each folder below the user folder opened
    without following a link (made when missing and ``create``); -1 when missing. A link
    or a file on the way: :class:`OutputError`."""
    root = user_dir()
    try:
        if create:
            os.makedirs(root, mode=0o700, exist_ok=True)
        fd = os.open(root, _DIR & ~getattr(os, "O_NOFOLLOW", 0))
    except FileNotFoundError:
        return -1
    except OSError as exc:
        raise OutputError(f"{root}: {exc.strerror or exc}") from None
    shown = root
    try:
        for part in parts:
            shown = shown / part
            try:
                sub = os.open(part, _DIR, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    os.close(fd)
                    return -1
                make_folder(part, fd)
                sub = os.open(part, _DIR, dir_fd=fd)
            os.close(fd)
            fd = sub
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise OutputError(f"{shown} is a symbolic link or not a folder; envguard keeps "
                              "its own state only in real folders, never through a link "
                              "(remove it)") from None
        raise OutputError(f"{shown}: {exc.strerror or exc}") from None
    return fd


def read_at(folder: int, name: str, limit: int) -> bytes:
    """The bytes of the regular file ``name`` in the open ``folder``, not followed, at most
    ``limit`` (OSError otherwise)."""
    fd = os.open(name, FILE_FLAGS, dir_fd=folder)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        chunks, total = [], 0
        while chunk := os.read(fd, min(CHUNK, limit + 1 - total) or 1):
            chunks.append(chunk)
            total += len(chunk)
            if total > limit:
                raise OSError(errno.EFBIG, f"larger than {limit:,} bytes")
        return b"".join(chunks)
    finally:
        os.close(fd)


def record_digest(hasher: hashlib._Hash) -> str:
    """``algorithm=urlsafe-b64`` as RECORD writes a hash."""
    return f"{hasher.name}=" + base64.urlsafe_b64encode(hasher.digest()).rstrip(b"=").decode()


def hasher_for(digest: str) -> hashlib._Hash | None:
    """A new hasher of RECORD's algorithm for ``digest`` (``sha256=...``); None for a weak
    or unknown one."""
    algorithm = digest.partition("=")[0].lower()
    if algorithm in WEAK or algorithm not in hashlib.algorithms_guaranteed:
        return None
    return hashlib.new(algorithm)


def find_kept(dist: Distribution) -> KeptLookup | None:
    """The kept build of ``dist`` (its exact fingerprint), why it could not be kept, or None
    when envguard never tried to keep it."""
    key = key_of(dist.fingerprint)
    if key is None or info_name(dist) is None:
        return None
    try:
        root = open_folder([KEPT_FOLDER], create=False)
    except OutputError as exc:
        return KeptLookup(folder=None, reason=str(exc))
    if root < 0:
        return None
    try:
        try:
            st = os.stat(key, dir_fd=root, follow_symlinks=False)
        except FileNotFoundError:
            return _marker(root, key)
        if not stat.S_ISDIR(st.st_mode):
            return KeptLookup(folder=None, reason=f"{kept_root() / key} is not a folder "
                              "(a link there is never followed)")
        return KeptLookup(folder=str(kept_root() / key))
    finally:
        os.close(root)


def _marker(root: int, key: str) -> KeptLookup | None:
    try:
        data = json.loads(read_at(root, f"{key}.json", MARKER_BYTES))
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return KeptLookup(folder=None, reason="envguard could not keep it (its note is "
                          "unreadable)")
    reason = data.get("reason") if isinstance(data, dict) else None
    if not isinstance(reason, str) or data.get("schema") != MARKER_SCHEMA:
        return KeptLookup(folder=None, reason="envguard could not keep it")
    return KeptLookup(folder=None, reason="envguard could not keep it before it was "
                      f"replaced: {reason[:500]}")


def wheel_from_kept(dist: Distribution, out: Path) -> tuple[Path | None, str]:
    """(the kept build of ``dist`` zipped into ``out/<name>-<version>-<tag>.whl``, "") or
    (None, why not): a file missing, added, changed since it was kept, or a link."""
    from envguard.revisions.builds import wheel_tag

    key, info = key_of(dist.fingerprint), info_name(dist)
    if key is None or info is None:
        return None, "not a build envguard keeps"
    try:
        root = open_folder([KEPT_FOLDER, key], create=False)
    except OutputError as exc:
        return None, str(exc)
    if root < 0:
        return None, "the kept build is gone"
    wheel: Path | None = None
    try:
        info_fd = os.open(info, _DIR, dir_fd=root)
        try:
            record = read_at(info_fd, "RECORD", RECORD_LIMIT).decode("utf-8", "replace")
            tag = wheel_tag(read_at(info_fd, "WHEEL", MARKER_BYTES).decode("utf-8", "replace"))
        finally:
            os.close(info_fd)
        rows = {r[0]: r for r in parse_record(record) if r[1]}
        wheel = out / f"{info[: -len('.dist-info')]}-{tag}.whl"
        with zipfile.ZipFile(wheel, "w", zipfile.ZIP_STORED) as zf:
            seen = _zip_tree(zf, root, rows, f"{info}/RECORD", record.encode("utf-8"))
        missing = sorted(set(rows) - seen)
        if missing:
            raise OSError(errno.ENOENT, f"{missing[0]} is missing")
        return wheel, ""
    except OSError as exc:
        if wheel is not None:
            wheel.unlink(missing_ok=True)
        what = (exc.strerror or str(exc)) if exc.errno != errno.ELOOP else "a symbolic link"
        return None, f"the kept build in {kept_root() / key} is damaged: {what}"
    finally:
        os.close(root)


def _zip_tree(zf: zipfile.ZipFile, root: int, rows: dict[str, RecordRow], record_name: str,
              record: bytes) -> set[str]:
    """Every file below the open ``root`` into ``zf``, each checked against its row of the
    kept RECORD while it is read; the paths written."""
    seen: set[str] = set()
    for folder, dirs, files, fd in os.fwalk(".", dir_fd=root, follow_symlinks=False):
        dirs.sort()
        for name in sorted(files):
            rel = os.path.normpath(os.path.join(folder, name)).replace(os.sep, "/")
            if rel == record_name:
                zf.writestr(_zip_info(rel, os.lstat(name, dir_fd=fd)), record)
                continue
            row = rows.get(rel)
            if row is None:
                raise OSError(errno.EEXIST, f"{rel} is not in its RECORD")
            hasher = hasher_for(row[1])
            if hasher is None:
                raise OSError(errno.EINVAL, f"{rel}: no usable hash in its RECORD")
            src = os.open(name, FILE_FLAGS, dir_fd=fd)
            try:
                st = os.fstat(src)
                if not stat.S_ISREG(st.st_mode):
                    raise OSError(errno.EINVAL, f"{rel} is not a regular file")
                with zf.open(_zip_info(rel, st), "w") as dest:
                    while chunk := os.read(src, CHUNK):
                        hasher.update(chunk)
                        dest.write(chunk)
            finally:
                os.close(src)
            if record_digest(hasher) != row[1]:
                raise OSError(errno.EINVAL, f"{rel} changed since it was kept")
            seen.add(rel)
    return seen


def _zip_info(name: str, st: os.stat_result) -> zipfile.ZipInfo:
    when = time.localtime(max(st.st_mtime, 315532800.0))[:6]  # the zip format starts in 1980
    info = zipfile.ZipInfo(name, date_time=when)
    info.compress_type = zipfile.ZIP_STORED
    info.external_attr = (stat.S_IFREG | (st.st_mode & 0o777)) << 16
    info.file_size = st.st_size
    return info
