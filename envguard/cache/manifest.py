"""The archive manifest of ``envguard cache``: its frozen dataclasses, its strict parser,
and reading a store of archives. No writing here (see :mod:`envguard.cache.store`)."""

from __future__ import annotations

import dataclasses
import json
import os
import re
from dataclasses import field
from pathlib import Path

from envguard.errors import InputError, SnapshotValidationError
from envguard.frozen import frozen
from envguard.input_file import read_input
from envguard.model import Snapshot
from envguard.redact import redact_data
from envguard.validation import build

SCHEMA_NAME = "envguard.cache-archive"
SCHEMA_MAJOR = 1
SCHEMA = f"{SCHEMA_NAME}/{SCHEMA_MAJOR}"
MANIFEST = "manifest.json"
ARCHIVED_KINDS = ("inductor", "triton")
MAX_MANIFEST_BYTES = 1 << 20
_SCHEMA_RE = re.compile(rf"{re.escape(SCHEMA_NAME)}/([0-9]{{1,9}})(?:\.[0-9]{{1,9}})?")
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,127}")
_SHA_RE = re.compile(r"[0-9a-f]{64}")


@frozen
class Build:
    """The build whose compile caches are saved or restored (what the compat key covers)."""

    compat_key: str | None
    torch_version: str | None = None
    torch_git_version: str | None = None
    triton_version: str | None = None
    gpus: list[str] = field(default_factory=list)
    host: str = ""
    python: str = ""

    @classmethod
    def of(cls, snapshot: Snapshot) -> Build:
        t = snapshot.torch
        return cls(compat_key=t.compat_key, torch_version=t.version,
                   torch_git_version=t.git_version, triton_version=t.triton_version,
                   gpus=[g.name for g in snapshot.system.gpus], host=snapshot.system.hostname,
                   python=snapshot.interpreter.executable)


@frozen
class ArchivePart:
    """One cache folder archived as one tar file of the archive."""

    kind: str
    file: str
    source: str
    """The folder it was saved from."""
    files: int
    total_bytes: int
    tar_bytes: int
    sha256: str
    skipped: list[str] = field(default_factory=list)
    """Entries left out: symlinks pointing out of the cache, sockets, fifos, vanished files."""
    state_at_save: str = "unknown"
    """The cache's validity when saved (see :func:`validity`)."""


@frozen
class SnapshotRef:
    created_at: str
    file: str


@frozen
class Manifest:
    schema: str
    name: str
    created: str
    envguard_version: str
    build: Build
    archives: list[ArchivePart]
    snapshot: SnapshotRef | None = None

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2, sort_keys=True) + "\n"

    @property
    def total_bytes(self) -> int:
        return sum(p.total_bytes for p in self.archives)

    @property
    def files(self) -> int:
        return sum(p.files for p in self.archives)


@frozen
class StoredArchive:
    """A folder of the store: its manifest, or why it cannot be used."""

    name: str
    path: str
    manifest: Manifest | None
    problem: str | None = None
    matches: bool = False
    """Saved under the current compat key."""



def validate_name(name: str) -> str:
    if not _NAME_RE.fullmatch(name):
        raise InputError(f"invalid archive name {name!r}: use letters, digits and ._+- "
                         "(at most 128, not starting with a dot or dash)")
    return name


def build_label(b: Build) -> str:
    """``torch 2.11.0+cu128 (git 70d99e998b49)``; ``no torch`` without one."""
    if b.torch_version is None:
        return "no torch"
    return f"torch {b.torch_version} (git {(b.torch_git_version or 'unknown')[:12]})"



# -- reading the store ------------------------------------------------------------------

def short_key(key: str | None) -> str:
    """A compat key's first 12 hex digits; ``none`` when unknown."""
    return (key or "none").removeprefix("sha256:")[:12]


def build_differences(saved: Build, current: Build) -> str:
    """What separates two builds, most telling first (not yet cleaned for a screen)."""
    if (saved.torch_version, saved.torch_git_version) != (current.torch_version,
                                                          current.torch_git_version):
        text = (f"it was saved under {build_label(saved)}, this environment has "
                f"{build_label(current)}")
    else:
        diffs = []
        if saved.triton_version != current.triton_version:
            diffs.append(f"triton {saved.triton_version} ≠ {current.triton_version}")
        if sorted(saved.gpus) != sorted(current.gpus):
            diffs.append(f"GPUs {', '.join(saved.gpus) or 'none'} ≠ "
                         f"{', '.join(current.gpus) or 'none'}")
        text = (f"both have {build_label(current)}, but "
                + (", ".join(diffs) or "torch's sources or triton's build differ"))
    return (f"{text} (compat key {short_key(saved.compat_key)} ≠ "
            f"{short_key(current.compat_key)})")


def parse_manifest(text: str, where: str) -> Manifest:
    """Validate a manifest; InputError (exit 2) naming ``where`` for anything unusable."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise InputError(f"{where}: not an envguard cache archive manifest (not JSON: "
                         f"{str(exc).split(':', 1)[0]})") from None
    except RecursionError:
        raise InputError(f"{where}: not a cache archive manifest (nested too deeply)") from None
    schema = data.get("schema") if isinstance(data, dict) else None
    match = _SCHEMA_RE.fullmatch(schema) if isinstance(schema, str) else None
    if match is None:
        raise InputError(f"{where}: not an envguard cache archive manifest "
                         f"(schema {schema!r}, expected {SCHEMA!r})")
    if int(match.group(1)) != SCHEMA_MAJOR:
        newer = int(match.group(1)) > SCHEMA_MAJOR
        raise InputError(f"{where}: cache archive schema {schema} is not the one this envguard "
                         f"reads ({SCHEMA})" + ("; upgrade envguard" if newer else ""))
    try:
        manifest = build(Manifest, data)
    except SnapshotValidationError as exc:
        raise InputError(f"{where}: malformed cache archive manifest: {exc}") from None
    kinds = [p.kind for p in manifest.archives]
    for part in manifest.archives:
        problem = None
        if part.kind not in ARCHIVED_KINDS or kinds.count(part.kind) > 1:
            problem = f"unknown or repeated kind {part.kind!r}"
        elif part.file not in (f"{part.kind}.tar", f"{part.kind}.tar.gz"):
            problem = f"unexpected file name {part.file!r}"
        elif not _SHA_RE.fullmatch(part.sha256):
            problem = "sha256 is not 64 hex digits"
        elif min(part.files, part.total_bytes, part.tar_bytes) < 0:
            problem = "negative size"
        if problem:
            raise InputError(f"{where}: malformed cache archive manifest: {problem}")
    if not manifest.archives:
        raise InputError(f"{where}: malformed cache archive manifest: no archives")
    return redact_data(manifest)  # one written by hand or an older envguard keeps no secret


def read_manifest(folder: Path) -> Manifest:
    path = folder / MANIFEST
    if not path.exists():
        raise InputError(f"{folder}: not a cache archive (no {MANIFEST})")
    raw = read_input(path, what="cache archive manifest", limit=MAX_MANIFEST_BYTES)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise InputError(f"{path}: not a cache archive manifest (not UTF-8)") from None
    return parse_manifest(text, str(path))


def list_archives(store: Path, key: str | None) -> list[StoredArchive]:
    """Every archive in the store, newest first; unusable ones carry their ``problem``."""
    try:
        names = sorted(e.name for e in os.scandir(store) if e.is_dir(follow_symlinks=False)
                       and not e.name.startswith("."))
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise InputError(f"{store}: cannot read the archive store: "
                         f"{exc.strerror or exc}") from None
    found = []
    for name in names:
        folder = store / name
        try:
            m = read_manifest(folder)
        except InputError as exc:
            found.append(StoredArchive(name=name, path=str(folder), manifest=None,
                                       problem=str(exc)))
            continue
        found.append(StoredArchive(name=name, path=str(folder), manifest=m,
                                   matches=key is not None and m.build.compat_key == key))
    found.sort(key=lambda a: a.manifest.created if a.manifest else "", reverse=True)
    return found


def choose(archives: list[StoredArchive], name: str | None, store: Path) -> StoredArchive:
    """The named archive, else the newest one saved under the current key.

    Without a name and with no matching archive, the newest readable one is returned
    (``matches`` False): the caller refuses it unless forced.
    """
    if name is not None:
        validate_name(name)
        for a in archives:
            if a.name == name:
                if a.manifest is None:
                    raise InputError(a.problem or f"{a.path}: unusable")
                return a
        raise InputError(f"no archive called {name!r} in {store}")
    usable = [a for a in archives if a.manifest is not None]
    if not usable:
        raise InputError(f"no cache archives in {store} (envguard cache save makes one)")
    return next((a for a in usable if a.matches), usable[0])


