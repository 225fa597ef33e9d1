"""Keep a distribution's installed build before a change replaces or removes it, so that
``envguard undo`` can put it back when uv's cache does not hold it (pip installed it, or
uv's cache was cleaned since).

:func:`keep_builds` takes the distributions a prediction says will be replaced or removed;
for each index install whose exact build :func:`envguard.revisions.builds.find_in_uv_cache`
does not find, it lays the installed build out as an unpacked wheel in the store of
:mod:`.kept` (the layout is described there), from the distribution's own RECORD:

- a file under site-packages at its path there; one elsewhere in the environment under
  ``NAME-VER.data/scripts/`` (``bin/``: the shebang the installer wrote is given back as
  ``#!python``) or ``NAME-VER.data/data/`` (by its path in the environment); the console
  scripts an installer writes from ``entry_points.txt`` and compiled bytecode are left out
  (an installer makes them anew), as are INSTALLER, REQUESTED and direct_url.json;
- each file hard linked where the filesystem allows (the installer unlinks the installed
  path; the store keeps the inode), copied otherwise, within :data:`MAX_COPY_BYTES` for
  all copies of one call; every file is checked against its RECORD hash as it is kept;
- written into a temporary folder beside the store's entry, renamed into place only when
  complete (an interrupt, an error or a kill leaves no entry; a temporary a kill left is
  removed by a later call once an hour old).

A build that cannot be kept (a file that no longer matches its RECORD, one outside the
environment, a copy over the bound) keeps nothing: its reason is written beside the store's
entries, and undo says it instead of restoring something else.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import re
import shutil
import stat
import time
from collections.abc import Iterable, Mapping, Sequence

from envguard.atomic import write_text_atomic
from envguard.frozen import frozen
from envguard.input_file import METADATA_BYTES, NotReadable, read_bounded_text
from envguard.model import Distribution
from envguard.paths import user_dir
from envguard.probe.recordfile import (
    fingerprint_record,
    is_fingerprinted,
    is_script_row,
    record_rows,
)
from envguard.revisions.builds import find_in_uv_cache
from envguard.revisions.kept import (
    CHUNK,
    FILE_FLAGS,
    KEPT_FOLDER,
    MARKER_SCHEMA,
    hasher_for,
    info_name,
    kept_root,
    key_of,
    open_folder,
    record_digest,
)

MAX_COPY_BYTES = 4 << 30
"""4 GiB: what one call copies at most, in all, where hard links cannot be made (the store on
another filesystem). A build whose copy would pass it is not kept."""
STALE_S = 3600.0
_TEMP = re.compile(r"\.sha256-[0-9a-f]{64}\.[0-9a-f]{8}\.tmp")
_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0) \
    | getattr(os, "O_NOFOLLOW", 0)
_SHEBANG = re.compile(rb"#![ \t]*(?P<path>/\S+)[^\n]*\n?")


@frozen
class KeptBuild:
    """One build :func:`keep_builds` was asked to keep: ``kept``, ``already kept`` or
    ``not kept`` (``detail`` says why)."""

    name: str
    version: str | None
    outcome: str
    detail: str = ""
    linked: int = 0
    copied: int = 0
    copied_bytes: int = 0


@frozen
class _File:
    src: str
    dest: str
    """Its path in the wheel."""
    digest: str
    size: str
    script: bool
    bin: str = ""
    """The environment's ``bin`` folder (real path), for a script's shebang."""


class _Unkeepable(Exception):
    pass


def keep_builds(dists: Iterable[Distribution | None], *, prefix: str, env: Mapping[str, str],
                copy_limit: int = MAX_COPY_BYTES) -> tuple[KeptBuild, ...]:
    """Keep each index-installed build of ``dists`` (those of the environment at ``prefix``)
    that uv's cache does not hold; one :class:`KeptBuild` for each it tried. A link in the
    store's path: :class:`~envguard.errors.OutputError`, before anything is kept."""
    real = os.path.realpath(prefix)
    wanted = [d for d in dists if d is not None and not d.editable and d.direct_url is None
              and key_of(d.fingerprint) and info_name(d)
              and os.path.realpath(d.location).startswith(real + os.sep)]
    if not wanted:
        return ()
    root = open_folder([KEPT_FOLDER], create=True)
    try:
        _sweep(root)
        budget = [copy_limit]
        return tuple(_keep(root, d, real, budget) for d in wanted
                     if find_in_uv_cache(d, env) is None)
    finally:
        os.close(root)


def _keep(root: int, dist: Distribution, prefix: str, budget: list[int]) -> KeptBuild:
    key = key_of(dist.fingerprint)
    assert key is not None  # noqa: S101 - keep_builds took only these
    if _exists(root, key):
        return KeptBuild(name=dist.name, version=dist.version, outcome="already kept",
                         detail=str(kept_root() / key))
    try:
        files = list(_files(dist, prefix))
        linked, copied, copied_bytes = _write(root, key, dist, files, budget)
    except _Unkeepable as exc:
        reason = str(exc)
        write_text_atomic(kept_root() / f"{key}.json", json.dumps(
            {"schema": MARKER_SCHEMA, "name": dist.name, "version": dist.version,
             "fingerprint": dist.fingerprint, "reason": reason}, indent=2) + "\n",
            mode=0o600, state_root=user_dir())
        return KeptBuild(name=dist.name, version=dist.version, outcome="not kept",
                         detail=reason)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(f"{key}.json", dir_fd=root)  # a failed try before: kept now
    return KeptBuild(name=dist.name, version=dist.version, outcome="kept",
                     detail=str(kept_root() / key), linked=linked, copied=copied,
                     copied_bytes=copied_bytes)


def _exists(root: int, name: str) -> bool:
    try:
        return stat.S_ISDIR(os.stat(name, dir_fd=root, follow_symlinks=False).st_mode)
    except FileNotFoundError:
        return False


def _entry_points(info_dir: str) -> set[str]:
    """The console and GUI script names ``entry_points.txt`` declares (an installer writes
    those scripts itself)."""
    try:
        text = read_bounded_text(os.path.join(info_dir, "entry_points.txt"),
                                 limit=METADATA_BYTES, what="entry_points.txt")
    except (OSError, NotReadable):
        return set()
    names, section = set(), ""
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("["):
            section = line.strip("[]").strip()
        elif section in ("console_scripts", "gui_scripts") and "=" in line:
            names.add(line.split("=", 1)[0].strip())
    return names


def _files(dist: Distribution, prefix: str) -> Iterable[_File]:
    """What to keep of ``dist``, from its RECORD; :class:`_Unkeepable` for what cannot be."""
    info = info_name(dist)
    assert info is not None  # noqa: S101 - keep_builds took only these
    stem, location = info[: -len(".dist-info")], os.path.realpath(dist.location)
    info_dir = os.path.join(location, dist.metadata_dir)  # relative to its location
    try:
        rows = record_rows(os.path.join(info_dir, "RECORD"))
    except (OSError, NotReadable) as exc:
        raise _Unkeepable(f"its RECORD cannot be read ({exc})") from None
    if fingerprint_record([r for r in rows if is_fingerprinted(r[0])]) != dist.fingerprint:
        raise _Unkeepable("its RECORD changed after the prediction's snapshot")
    scripts, seen = _entry_points(info_dir), set()
    for path, digest, size in rows:
        script = is_script_row(path)
        if not (script or is_fingerprinted(path)):
            continue
        full = os.path.normpath(os.path.join(location, path))
        if script:
            if os.path.basename(full) in scripts:
                continue
            dest = f"{stem}.data/scripts/{os.path.basename(full)}"
        elif not (rel := os.path.relpath(full, location)).startswith(".."):
            dest = rel.replace(os.sep, "/")
        elif not (rel := os.path.relpath(full, prefix)).startswith(".."):
            dest = f"{stem}.data/data/" + rel.replace(os.sep, "/")
        else:
            raise _Unkeepable(f"{path} lies outside the environment")
        if not os.path.realpath(os.path.dirname(full)).startswith(prefix + os.sep):
            raise _Unkeepable(f"{path} lies outside the environment (through a link)")
        if hasher_for(digest) is None:
            raise _Unkeepable(f"its RECORD gives no usable hash for {path}")
        if dest not in seen:
            seen.add(dest)
            yield _File(src=full, dest=dest, digest=digest, size=size, script=script,
                        bin=os.path.join(prefix, "bin"))


def _write(root: int, key: str, dist: Distribution, files: Sequence[_File],
           budget: list[int]) -> tuple[int, int, int]:
    """``files`` into a new temporary folder of the open store ``root``, renamed to ``key``
    once complete: (linked, copied, bytes copied). Nothing is left behind on any error."""
    if os.fstat(root).st_dev != os.stat(dist.location).st_dev:  # no link can be made
        total = sum(int(f.size) for f in files if f.size.isdigit())
        if total > budget[0]:
            raise _Unkeepable(_over(total, budget[0]))
    tmp = f".{key}.{os.urandom(4).hex()}.tmp"
    folders: dict[str, int] = {}
    try:  # the folder is made inside: a Ctrl-C right after mkdir still removes it
        os.mkdir(tmp, 0o700, dir_fd=root)
        folders[""] = os.open(tmp, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=root)
        counts, rows = [0, 0, 0], []
        for f in files:
            folder = _folder(folders, os.path.dirname(f.dest))
            rows.append((f.dest, *_place(f, folder, os.path.basename(f.dest), budget, counts)))
        info = info_name(dist)
        text = io.StringIO()
        writer = csv.writer(text, lineterminator="\n")
        writer.writerows([*rows, (f"{info}/RECORD", "", "")])
        fd = os.open("RECORD", _NEW, 0o644, dir_fd=_folder(folders, str(info)))
        try:
            os.write(fd, text.getvalue().encode("utf-8"))
        finally:
            os.close(fd)
        for fd in folders.values():
            os.close(fd)
        folders.clear()
        try:
            os.rename(tmp, key, src_dir_fd=root, dst_dir_fd=root)
        except OSError:
            if not _exists(root, key):
                raise
            shutil.rmtree(tmp, dir_fd=root, ignore_errors=True)  # kept meanwhile by another
        return counts[0], counts[1], counts[2]
    except BaseException:
        for fd in folders.values():
            os.close(fd)
        shutil.rmtree(tmp, dir_fd=root, ignore_errors=True)
        raise


def _folder(folders: dict[str, int], rel: str) -> int:
    """The open folder ``rel`` of the temporary tree (made as needed, never followed)."""
    if rel in folders:
        return folders[rel]
    parent = _folder(folders, os.path.dirname(rel))
    name = os.path.basename(rel)
    with contextlib.suppress(FileExistsError):
        os.mkdir(name, 0o755, dir_fd=parent)
    folders[rel] = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=parent)
    return folders[rel]


def _place(f: _File, folder: int, name: str, budget: list[int],
           counts: list[int]) -> tuple[str, str]:
    """``f`` linked (else copied) as ``name`` into the open ``folder``, checked against its
    RECORD hash; the hash and size the kept RECORD gives it."""
    try:
        st = os.lstat(f.src)
    except OSError as exc:
        raise _Unkeepable(f"{f.dest}: {exc.strerror or exc}") from None
    if not stat.S_ISREG(st.st_mode):
        raise _Unkeepable(f"{f.src} is not a regular file")
    if f.size.isdigit() and int(f.size) != st.st_size:
        raise _Unkeepable(_edited(f))
    if not f.script:
        try:
            os.link(f.src, name, dst_dir_fd=folder, follow_symlinks=False)
        except OSError:
            pass
        else:
            counts[0] += 1
            if _hash_of(folder, name, f.digest) != f.digest:
                raise _Unkeepable(_edited(f))
            return f.digest, str(st.st_size)
    if st.st_size > budget[0]:
        raise _Unkeepable(_over(st.st_size, budget[0]))
    budget[0] -= st.st_size
    counts[1] += 1
    counts[2] += st.st_size
    return _copy(f, folder, name, st)


def _hash_of(folder: int, name: str, digest: str) -> str:
    hasher = hasher_for(digest)
    assert hasher is not None  # noqa: S101 - _files took only these
    fd = os.open(name, FILE_FLAGS, dir_fd=folder)
    try:
        while chunk := os.read(fd, CHUNK):
            hasher.update(chunk)
    finally:
        os.close(fd)
    return record_digest(hasher)


def _copy(f: _File, folder: int, name: str, st: os.stat_result) -> tuple[str, str]:
    """Copy ``f`` (a script with its shebang given back as ``#!python``), checking the
    source against its RECORD hash; the copy's own hash and size."""
    source, own = hasher_for(f.digest), hasher_for(f.digest)
    assert source is not None and own is not None  # noqa: S101 - _files took only these
    src = os.open(f.src, FILE_FLAGS)
    try:
        dest = os.open(name, _NEW, (st.st_mode & 0o755) | 0o600, dir_fd=folder)
        try:
            first, size = True, 0
            while chunk := os.read(src, CHUNK):
                source.update(chunk)
                if first and f.script:
                    chunk = _python_shebang(chunk, f.bin)
                first = False
                own.update(chunk)
                size += len(chunk)
                view = memoryview(chunk)
                while view:
                    view = view[os.write(dest, view):]
        finally:
            os.close(dest)
    finally:
        os.close(src)
    if record_digest(source) != f.digest:
        raise _Unkeepable(_edited(f))
    return record_digest(own), str(size)


def _python_shebang(head: bytes, bin_folder: str) -> bytes:
    """A script's first bytes with the environment's interpreter an installer wrote
    (``#!/venv/bin/python``) given back as the wheel's ``#!python``; any other first line
    as it is."""
    match = _SHEBANG.match(head)
    if match is None:
        return head
    path = os.fsdecode(match.group("path"))
    if not (os.path.basename(path).startswith("python")
            and os.path.realpath(os.path.dirname(path)) == bin_folder):
        return head
    return b"#!python\n" + head[match.end():]


def _edited(f: _File) -> str:
    return f"{f.dest} no longer matches its RECORD (changed after it was installed)"


def _over(size: int, left: int) -> str:
    return (f"its files cannot be hard linked into {kept_root()} and copying {size:,} bytes "
            f"would pass envguard's bound ({left:,} bytes left of {MAX_COPY_BYTES:,})")


def _sweep(root: int) -> None:
    """Remove temporaries a killed envguard left in the store, once an hour old."""
    cutoff = time.time() - STALE_S
    with contextlib.suppress(OSError), os.scandir(root) as entries:
        stale = [e.name for e in entries if _TEMP.fullmatch(e.name)
                 and e.is_dir(follow_symlinks=False)
                 and e.stat(follow_symlinks=False).st_mtime < cutoff]
    for name in stale:
        shutil.rmtree(name, dir_fd=root, ignore_errors=True)
