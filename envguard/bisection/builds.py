"""Find the exact build of a distribution: the wheel whose files give its fingerprint.

A same-version rebuild (torch 2.11.0+cu130 from commit e2b8a1c7, then from 70d99e99) cannot
be pinned by version: the index serves whichever build it has. So each build a bisection
needs is looked for, in this order, and accepted only when its RECORD gives the snapshot's
fingerprint (:func:`envguard.probe.recordfile.fingerprint_record`):

1. the snapshot's own direct URL (``name @ file:///…whl`` that still exists, or a remote URL,
   which carries its archive hash);
2. the ``--find-links`` folders: every ``*.whl`` of that name and version;
3. uv's cache (``archive-v0/*``: each entry is an unpacked wheel), packed back into a wheel;
4. the environment the snapshot was taken of, if it is still on disk and every file still
   has the hash its RECORD gives, packed into a wheel.

Nothing is installed from an index "by version" for such a change: when no source holds the
build, :func:`locate` returns None and the caller says so.
"""

from __future__ import annotations

import hashlib
import os
import re
import zipfile
from collections.abc import Iterator, Sequence
from pathlib import Path

from packaging.utils import canonicalize_name

from envguard.explain.remedies import check_name, field_key
from envguard.frozen import frozen
from envguard.input_file import NotReadable, read_bounded, read_bounded_text
from envguard.model import Distribution
from envguard.probe.integrity import record_digest
from envguard.probe.recordfile import (
    fingerprint_record,
    is_fingerprinted,
    is_script_row,
    parse_record,
)
from envguard.restore.plan import file_url_path, requirement_for

MAX_RECORD = 64 << 20
MAX_WHEEL_FILE = 8 << 30
"""A file of an unpacked wheel in uv's cache larger than this (8 GiB) is not packed."""
"""A RECORD larger than this (64 MiB) is not read."""

_DATA = re.compile(r"^[^/]+\.data/(purelib|platlib|scripts|data|headers)/(.+)$")
_DROPPED = frozenset({"INSTALLER", "REQUESTED", "RECORD", "direct_url.json", "uv_cache.json"})


@frozen
class Build:
    """Where the exact build of one distribution was found."""

    name: str
    version: str
    fingerprint: str | None
    requirement: str
    """The requirements line that installs exactly it (``name @ file:///…whl``)."""
    source: str
    """``direct URL``, ``--find-links``, ``uv cache`` or ``installed``."""
    where: str


def _installed_path(path: str) -> str | None:
    """Where a wheel's RECORD path lands, relative to site-packages; None: a script."""
    m = _DATA.match(path)
    if m is None:
        return path
    scheme, rest = m.groups()
    if scheme in ("purelib", "platlib"):
        return rest
    if scheme == "scripts":
        return None
    return "../../../" + rest if scheme == "data" else "../../../include/site/" + rest


def record_fingerprint(record_text: str) -> str:
    """The installed fingerprint of a wheel, from the wheel's own RECORD."""
    rows = []
    for path, digest, size in parse_record(record_text):
        where = _installed_path(path)
        if where is not None and is_fingerprinted(where):
            rows.append((where, digest, size))
    return fingerprint_record(rows)


def _wheel_record(zf: zipfile.ZipFile) -> tuple[str, str] | None:
    """(dist-info folder, RECORD text) of an open wheel."""
    for info in zf.infolist():
        parts = info.filename.split("/")
        if len(parts) == 2 and parts[0].endswith(".dist-info") and parts[1] == "RECORD":
            if info.file_size > MAX_RECORD:
                return None
            return parts[0], zf.read(info).decode("utf-8", "replace")
    return None


def wheel_fingerprint(path: Path) -> str | None:
    """The fingerprint the wheel at ``path`` gives once installed; None if unreadable."""
    try:
        with zipfile.ZipFile(path) as zf:
            found = _wheel_record(zf)
    except (OSError, zipfile.BadZipFile, ValueError):
        return None
    return record_fingerprint(found[1]) if found else None


def _wheel_matches(filename: str, name: str, version: str) -> bool:
    parts = filename[:-4].split("-")
    return (len(parts) >= 5 and canonicalize_name(parts[0]) == name
            and parts[1].replace("_", "-") == version.replace("_", "-"))


def _find_links_wheels(folders: Sequence[str], dist: Distribution) -> Iterator[Path]:
    for folder in folders:
        if "://" in folder:
            continue
        try:
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError:
            continue
        for entry in entries:
            if entry.name.endswith(".whl") and _wheel_matches(entry.name, dist.name,
                                                              dist.version or ""):
                yield Path(entry.path)


def uv_cache_dir(env: dict[str, str] | os._Environ[str] = os.environ) -> Path | None:
    """uv's cache folder: ``UV_CACHE_DIR``, else ``$XDG_CACHE_HOME/uv``, else ``~/.cache/uv``."""
    if env.get("UV_NO_CACHE"):
        return None
    explicit = env.get("UV_CACHE_DIR")
    if explicit:
        return Path(explicit)
    xdg = env.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "uv"


def _dist_info_name(folder: str, name: str, version: str) -> bool:
    stem = folder.removesuffix(".dist-info")
    head, _, ver = stem.rpartition("-")
    return canonicalize_name(head) == name and ver == version


def _uv_cache_entries(cache: Path, dist: Distribution) -> Iterator[tuple[Path, str]]:
    """(unpacked wheel, its dist-info folder name) in uv's archive cache for ``dist``."""
    try:
        archives = list(os.scandir(cache / "archive-v0"))
    except OSError:
        return
    for archive in archives:
        try:
            names = os.listdir(archive.path)
        except OSError:
            continue
        for child in names:
            if child.endswith(".dist-info") and _dist_info_name(child, dist.name,
                                                                dist.version or ""):
                yield Path(archive.path), child


def _read_small(path: Path) -> str | None:
    try:  # bounded: a FIFO, a device or a file over MAX_RECORD is not read
        return read_bounded_text(path, limit=MAX_RECORD)
    except (OSError, NotReadable):
        return None


def _hash(data: bytes) -> str:
    return "sha256=" + record_digest(hashlib.sha256(data).digest())


def _wheel_name(info_dir: Path, dist_info: str) -> str:
    """``{name}-{version}-{tag}.whl`` from the dist-info's WHEEL file (its first ``Tag``)."""
    tag = "py3-none-any"
    text = _read_small(info_dir / "WHEEL") or ""
    for line in text.splitlines():
        if line.startswith("Tag:"):
            tag = line.split(":", 1)[1].strip()
            break
    return f"{dist_info.removesuffix('.dist-info')}-{tag}.whl"


def _pack(files: list[tuple[str, bytes]], dist_info: str, out: Path) -> Path:
    """A wheel at ``out`` holding ``files`` plus a RECORD written for them."""
    record = [f"{path},{_hash(data)},{len(data)}" for path, data in files]
    record.append(f"{dist_info}/RECORD,,")
    tmp = out.with_name(out.name + ".part")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_STORED) as zf:
        for path, data in files:
            zf.writestr(path, data)
        zf.writestr(f"{dist_info}/RECORD", "\n".join(record) + "\n")
    os.replace(tmp, out)
    return out


def _read_verified(path: Path, digest: str) -> bytes | None:
    """The file's bytes if its hash is the RECORD's ``digest``, else None."""
    try:  # a regular file only (a FIFO would block), of at most MAX_WHEEL_FILE
        data = read_bounded(path, limit=MAX_WHEEL_FILE)
    except (OSError, NotReadable):
        return None
    return data if not digest or _hash(data) == digest else None


def _pack_archive(root: Path, dist_info: str, out_dir: Path) -> Path | None:
    """Pack an unpacked wheel (uv's cache) back into a wheel, each file checked."""
    text = _read_small(root / dist_info / "RECORD")
    if text is None:
        return None
    files: list[tuple[str, bytes]] = []
    for path, digest, _size in parse_record(text):
        if path == f"{dist_info}/RECORD":
            continue
        data = _read_verified(root / path, digest)
        if data is None or ".." in path.split("/"):
            return None
        files.append((path, data))
    return _pack(files, dist_info, out_dir / _wheel_name(root / dist_info, dist_info))


def _entry_point_scripts(info: Path) -> set[str]:
    text = _read_small(info / "entry_points.txt") or ""
    names: set[str] = set()
    section = ""
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("["):
            section = line.strip("[]")
        elif "=" in line and section in ("console_scripts", "gui_scripts"):
            names.add(line.split("=", 1)[0].strip())
    return names


def _pack_installed(dist: Distribution, out_dir: Path) -> Path | None:
    """Pack an installed distribution into a wheel, if every file still matches RECORD."""
    site = Path(dist.location)
    info = site / dist.metadata_dir
    text = _read_small(info / "RECORD")
    if text is None or not dist.metadata_dir.endswith(".dist-info"):
        return None
    prefix = site.parents[2] if len(site.parents) > 2 else site
    data_dir = dist.metadata_dir.removesuffix(".dist-info") + ".data"
    generated = _entry_point_scripts(info)
    files: list[tuple[str, bytes]] = []
    for path, digest, _size in parse_record(text):
        base = path.replace("\\", "/").rsplit("/", 1)[-1]
        if path.endswith((".pyc", ".pyo")) or "__pycache__" in path or (
                path.startswith(dist.metadata_dir + "/") and base in _DROPPED):
            continue
        if is_script_row(path):
            if base in generated:
                continue  # the installer writes it again from entry_points.txt
            data = _read_verified(site / path, "")
            if data is None:
                return None
            if data.startswith(b"#!") and b"python" in data.split(b"\n", 1)[0]:
                data = b"#!python\n" + data.split(b"\n", 1)[1]
            files.append((f"{data_dir}/scripts/{base}", data))
            continue
        data = _read_verified(site / path, digest)
        if data is None:
            return None  # a file was edited or removed since the install: not that build
        if path.startswith(".."):
            rel = os.path.relpath(os.path.normpath(site / path), prefix)
            if rel.startswith(".."):
                return None
            files.append((f"{data_dir}/data/{rel}", data))
        else:
            files.append((path, data))
    return _pack(files, dist.metadata_dir, out_dir / _wheel_name(info, dist.metadata_dir))


def _file_requirement(name: str, path: Path) -> str:
    """``name @ file:///…whl``; the name (read from a snapshot) must be a PEP 508 name, so
    the line cannot be an option of the requirements file (UnsafeValue, exit 2)."""
    return f"{check_name(name, f'packages.{field_key(name)}.name')} @ {path.absolute().as_uri()}"


def locate(dist: Distribution, *, find_links: Sequence[str], uv_cache: Path | None,
           out_dir: Path) -> Build | None:
    """The exact build of ``dist`` (its fingerprint), or None when no source holds it.

    Wheels packed from uv's cache or from an installed environment are written to
    ``out_dir``.
    """
    version = dist.version or ""
    want = dist.fingerprint

    def build(requirement: str, source: str, where: str) -> Build:
        return Build(name=dist.name, version=version, fingerprint=want,
                     requirement=requirement, source=source, where=where)

    if dist.direct_url is not None and not dist.direct_url.editable:
        requirement, _kind, note = requirement_for(dist)
        local = file_url_path(dist.direct_url.url)
        exact = local is None or want is None or wheel_fingerprint(Path(local)) in (want, None)
        if requirement and "@" in requirement and not note and exact:
            return build(requirement, "direct URL", dist.direct_url.url)
    if want is None:
        return None
    for wheel in _find_links_wheels(find_links, dist):
        if wheel_fingerprint(wheel) == want:
            return build(_file_requirement(dist.name, wheel), "--find-links", str(wheel))
    out_dir.mkdir(parents=True, exist_ok=True)
    packed_name = f"{canonicalize_name(dist.name)}-{want.removeprefix('sha256:')[:16]}"
    if uv_cache is not None:
        for root, dist_info in _uv_cache_entries(uv_cache, dist):
            text = _read_small(root / dist_info / "RECORD")
            if text is not None and record_fingerprint(text) == want:
                packed = _pack_archive(root, dist_info, _fresh(out_dir / packed_name))
                if packed is not None and wheel_fingerprint(packed) == want:
                    return build(_file_requirement(dist.name, packed), "uv cache", str(root))
    if Path(dist.location, dist.metadata_dir, "RECORD").is_file():
        packed = _pack_installed(dist, _fresh(out_dir / (packed_name + "-installed")))
        if packed is not None and wheel_fingerprint(packed) == want:
            return build(_file_requirement(dist.name, packed), "installed",
                         str(Path(dist.location, dist.metadata_dir)))
    return None


def _fresh(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    return folder
