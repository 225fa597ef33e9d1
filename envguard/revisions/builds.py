"""The exact build of a distribution, found again: a wheel made from uv's cache.

uv keeps every wheel it installed unpacked in ``<cache>/archive-v0/<id>/`` (the wheel's
files and its own ``RECORD``). :func:`find_in_uv_cache` looks there for the archive whose
``*.dist-info`` folder has the distribution's name and version and whose RECORD gives the
same build fingerprint as the installed distribution's (:mod:`envguard.probe.recordfile`):
the same build, byte for byte, not the same version string. :func:`wheel_from_archive`
zips that folder back into a wheel (stored, not compressed) that uv installs from a
``--find-links`` folder. Bounded: at most :data:`MAX_ARCHIVES` archives are looked at.
A build uv's cache does not hold may be one envguard kept itself (:mod:`.kept`).
"""

from __future__ import annotations

import os
import re
import zipfile
from collections.abc import Mapping
from pathlib import Path

from envguard.input_file import NotReadable
from envguard.model import Distribution
from envguard.probe.hardlinks import ARCHIVES, uv_cache_dir
from envguard.probe.recordfile import fingerprint_record, read_record

MAX_ARCHIVES = 20_000
_TAG = re.compile(r"[A-Za-z0-9_.]+-[A-Za-z0-9_.]+-[A-Za-z0-9_.]+")


def find_in_uv_cache(dist: Distribution, env: Mapping[str, str]) -> Path | None:
    """uv's archive folder holding exactly ``dist``'s build, or None."""
    cache = uv_cache_dir(env)
    if cache is None or not dist.fingerprint:
        return None
    info = os.path.basename(dist.metadata_dir.rstrip("/"))
    if not info.endswith(".dist-info"):
        return None
    archives = cache / ARCHIVES
    try:
        entries = sorted(os.scandir(archives), key=lambda e: e.name)[:MAX_ARCHIVES]
    except OSError:
        return None
    for entry in entries:
        record = os.path.join(entry.path, info, "RECORD")
        if not os.path.isfile(record):
            continue
        try:
            rows = read_record(record)[1]
        except (OSError, ValueError, NotReadable):
            continue
        if fingerprint_record(rows) == dist.fingerprint:
            return Path(entry.path)
    return None


def _tag(info_dir: Path) -> str:
    """The wheel's compressed tag set from its WHEEL file (``py3-none-any``)."""
    try:
        text = (info_dir / "WHEEL").read_text(encoding="utf-8", errors="replace")
    except OSError:
        text = ""
    return wheel_tag(text)


def wheel_tag(text: str) -> str:
    """The compressed tag set a WHEEL file's ``text`` names (``py3-none-any`` if none)."""
    tags = []
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip().lower() == "tag" and _TAG.fullmatch(value.strip()):
            tags.append(value.strip())  # only tag characters: it goes into a file name
    if not tags:
        return "py3-none-any"
    heads = {t.rsplit("-", 1)[0] for t in tags}
    if len(heads) == 1:
        return f"{heads.pop()}-" + ".".join(dict.fromkeys(t.rsplit("-", 1)[1] for t in tags))
    return tags[0]


def wheel_from_archive(archive: Path, dist: Distribution, out: Path) -> Path:
    """Zip ``archive`` into ``out/<name>-<version>-<tag>.whl``; its path."""
    info = os.path.basename(dist.metadata_dir.rstrip("/"))
    stem = info[: -len(".dist-info")]
    wheel = out / f"{stem}-{_tag(archive / info)}.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_STORED) as zf:
        for folder, dirs, files in os.walk(archive):
            dirs.sort()
            for name in sorted(files):
                path = os.path.join(folder, name)
                if os.path.islink(path):
                    continue
                zf.write(path, os.path.relpath(path, archive))
    return wheel
