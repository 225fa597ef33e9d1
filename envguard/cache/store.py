"""Archives of torch.compile caches: save a warm cache, restore it under the same build.

A store is a folder (:func:`envguard.paths.archive_store` by default) of archives,
one folder each: ``NAME/manifest.json`` and one uncompressed tar per cache kind
(``inductor.tar``, ``triton.tar``). The manifest names the build the caches were
saved under (envguard's compat key, torch version and git commit, triton, GPUs) and
the sha256 of every tar. An archive is written as ``.NAME.partial-<pid>`` and renamed
into place, so a store never holds half an archive under a real name.

Restoring verifies every digest and every tar member before anything is written,
extracts beside the target as ``<target>.restoring-<pid>`` and swaps it in: the
cache that was there is kept as ``<target>.before-restore-<UTC time>``.

Pure data and file operations: nothing here prints; errors are one-line
:mod:`envguard.errors` exceptions.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import shutil
import tarfile
from dataclasses import field
from datetime import datetime, timezone
from pathlib import Path

from envguard.atomic import write_text_atomic
from envguard.cache.manifest import (
    ARCHIVED_KINDS,
    MANIFEST,
    SCHEMA,
    ArchivePart,
    Build,
    Manifest,
    SnapshotRef,
    StoredArchive,
    list_archives,
    validate_name,
)
from envguard.cache.provenance import Marked, mark_folder, mark_snapshot
from envguard.cache.tar import (
    HashingWriter,
    add_tree,
    check_members,
    extract_into,
    fsync_dir,
    open_archive,
    restore_cap,
    swap_into_place,
)
from envguard.errors import InputError, OutputError
from envguard.frozen import frozen
from envguard.model import BuildStamp, CacheDir, Snapshot
from envguard.probe import sightings
from envguard.version import __version__

VOLATILE_FS = ("tmpfs", "ramfs")
_CHUNK = 1 << 20
GZIP_LEVEL = 1

"""``--gzip`` level: 6 and 9 cost 2-4x the time for a few percent less (docs/CACHE.md)."""


@frozen
class CacheState:
    """A cache location of the current environment, for ``envguard cache status``."""

    kind: str
    path: str
    source: str
    state: str
    """``valid`` (the marker names this build: envguard filled or restored it), ``stale``
    (the marker names only other builds), ``seen`` (no marker for this build, but a
    snapshot saw it under this build), ``unknown``, ``empty`` or ``missing``."""
    files: int = 0
    total_bytes: int = 0
    entries: dict[str, int] = field(default_factory=dict)
    filesystem: str | None = None
    tmpfs: bool = False
    newest_mtime: float | None = None
    other_builds: list[str] = field(default_factory=list)
    """Other builds its marker names: ``torch 2.11.0+cu128 (git 70d99e998b49)``."""


@frozen
class CacheStatus:
    build: Build
    caches: list[CacheState]
    store: str
    archives: list[StoredArchive]
    now: float
    """When the status was taken (ages are computed from it)."""

    def to_dict(self) -> dict[str, object]:
        doc = dataclasses.asdict(self)
        doc["schema"] = "envguard.cache-status/1"
        return doc


@frozen
class Restored:
    kind: str
    target: str
    files: int
    previous: str | None
    """Where the cache that was there is kept; None when there was none or it was empty."""


def validity(c: CacheDir, key: str | None, *, seen: bool = False) -> str:
    """``seen``: envguard's own state says a snapshot saw this folder under ``key``."""
    if not c.exists:
        return "missing"
    if not c.files:
        return "empty"
    if c.marker in ("created", "added"):
        return "valid"  # snapshots of older envguard versions wrote the marker themselves
    if key is not None and any(s.compat_key == key for s in c.populated_under):
        return "valid"
    if c.populated_under:
        return "stale"
    return "seen" if seen else "unknown"


def cache_states(snapshot: Snapshot, state_root: Path | None = None) -> list[CacheState]:
    key = snapshot.torch.compat_key
    seen = sightings.load(state_root)
    out = []
    for c in snapshot.caches:
        others = [f"torch {s.torch_version} (git {(s.torch_git_version or 'unknown')[:12]})"
                  for s in c.populated_under if s.compat_key != key]
        out.append(CacheState(kind=c.kind, path=c.path, source=c.source,
                              state=validity(c, key, seen=sightings.seen_under(
                                  seen, c.path, key)), files=c.files,
                              total_bytes=c.total_bytes, entries=dict(c.entries),
                              filesystem=c.filesystem, tmpfs=c.filesystem in VOLATILE_FS,
                              newest_mtime=c.newest_mtime, other_builds=sorted(set(others))))
    return out


def status(snapshot: Snapshot, store: Path, now: float) -> CacheStatus:
    build_ = Build.of(snapshot)
    from envguard.redact import redact_text

    # the store is a path the user named: it never passed through a snapshot
    return CacheStatus(build=build_, caches=cache_states(snapshot), store=redact_text(str(store)),
                       archives=list_archives(store, build_.compat_key), now=now)


# -- saving --------------------------------------------------------------------------------

def _write_part(folder: Path, kind: str, root: str, compress: bool, state: str) -> ArchivePart:
    filename = f"{kind}.tar.gz" if compress else f"{kind}.tar"
    skipped: list[str] = []
    with open(folder / filename, "xb") as raw:
        writer = HashingWriter(raw)
        mode = "w:gz" if compress else "w"
        kwargs = {"compresslevel": GZIP_LEVEL} if compress else {}
        with tarfile.open(fileobj=writer, mode=mode, format=tarfile.PAX_FORMAT,  # type: ignore[call-overload]
                          **kwargs) as tar:
            files, total = add_tree(tar, root, skipped)
        raw.flush()
        os.fsync(raw.fileno())
    return ArchivePart(kind=kind, file=filename, source=root, files=files, total_bytes=total,
                       tar_bytes=writer.size, sha256=writer.sha.hexdigest(), skipped=skipped,
                       state_at_save=state)


def default_name(b: Build, now: datetime) -> str:
    key = (b.compat_key or "").removeprefix("sha256:")[:12] or "nokey"
    return f"{key}-{now.strftime('%Y%m%dT%H%M%SZ')}"


def to_save(snapshot: Snapshot) -> list[CacheDir]:
    """The inductor and triton caches that hold files; a triton cache inside the inductor
    one (its default ``triton/`` subfolder) is already part of the inductor archive."""
    chosen = [c for c in snapshot.caches if c.kind in ARCHIVED_KINDS and c.exists and c.files]
    inductor = next((c for c in chosen if c.kind == "inductor"), None)
    if inductor is not None:
        top = os.path.realpath(inductor.path) + os.sep
        chosen = [c for c in chosen if c is inductor
                  or not os.path.realpath(c.path).startswith(top)]
    return chosen


def save(store: Path, snapshot: Snapshot, *, name: str | None = None, compress: bool = False,
         snapshot_ref: SnapshotRef | None = None) -> Manifest:
    """Archive the snapshot's inductor (and triton) cache into ``store/NAME``."""
    chosen = to_save(snapshot)
    if not chosen:
        where = ", ".join(f"{c.kind} {c.path}" for c in snapshot.caches
                          if c.kind in ARCHIVED_KINDS)
        raise InputError(f"nothing to save: the compile caches are missing or empty ({where})")
    b = Build.of(snapshot)
    now = datetime.now(timezone.utc)
    if name is None:
        base = name = default_name(b, now)
        n = 1
        while (store / name).exists():
            name, n = f"{base}-{n}", n + 1
    validate_name(name)
    final = store / name
    if final.exists() or final.is_symlink():
        raise InputError(f"an archive called {name!r} already exists in {store}")
    partial = store / f".{name}.partial-{os.getpid()}"
    try:
        partial.mkdir(parents=True)
    except OSError as exc:
        raise OutputError(f"cannot write to the archive store {store}: "
                          f"{exc.strerror or exc}") from None
    try:
        seen = sightings.load()
        parts = [_write_part(partial, c.kind, c.path, compress, validity(
            c, b.compat_key, seen=sightings.seen_under(seen, c.path, b.compat_key)))
            for c in chosen]
        manifest = Manifest(schema=SCHEMA, name=name, created=now.strftime(
            "%Y-%m-%dT%H:%M:%S.%fZ"), envguard_version=__version__, build=b, archives=parts,
            snapshot=snapshot_ref)
        write_text_atomic(partial / MANIFEST, manifest.to_json())
        fsync_dir(partial)
        os.rename(partial, final)
        fsync_dir(store)
    except OSError as exc:
        raise OutputError(f"cannot write the archive {final}: {exc.strerror or exc}") from None
    finally:
        if partial.exists():
            shutil.rmtree(partial, ignore_errors=True)
    return manifest


# -- restoring -----------------------------------------------------------------------------

def verify(folder: Path, manifest: Manifest) -> None:
    """Check every tar's size and sha256 against the manifest; InputError on a mismatch."""
    for part in manifest.archives:
        path = folder / part.file
        sha = hashlib.sha256()
        size = 0
        try:
            with open_archive(path) as fh:  # a FIFO or device: refused, never waited on
                while chunk := fh.read(_CHUNK):
                    sha.update(chunk)
                    size += len(chunk)
        except OSError as exc:
            raise InputError(f"{path}: cannot read: {exc.strerror or exc}") from None
        if size != part.tar_bytes or sha.hexdigest() != part.sha256:
            raise InputError(f"{path}: damaged: {size:,} bytes with sha256 "
                             f"{sha.hexdigest()[:16]}…, the manifest says {part.tar_bytes:,} "
                             f"bytes, {part.sha256[:16]}…; nothing restored")


def targets_of(snapshot: Snapshot, into: str | None) -> dict[str, str]:
    """Where each kind is restored: the location the probe resolved, or ``INTO/<kind>``."""
    if into is not None:
        return {kind: os.path.join(os.path.abspath(into), kind) for kind in ARCHIVED_KINDS}
    return {c.kind: c.path for c in snapshot.caches if c.kind in ARCHIVED_KINDS}


def _refuse_target(target: str) -> None:
    """A cache location that is ``/``, the home or the working folder (an empty
    TORCHINDUCTOR_CACHE_DIR means the working folder) is not swapped aside."""
    real = os.path.realpath(target)
    for place in ("/", os.path.expanduser("~"), os.getcwd()):
        here = os.path.realpath(place)
        if here == real or here.startswith(real.rstrip("/") + "/"):
            raise InputError(f"will not restore into {target}: it holds {place}; set "
                             "TORCHINDUCTOR_CACHE_DIR/TRITON_CACHE_DIR or pass --into DIR")


def restore(folder: Path, manifest: Manifest, targets: dict[str, str]) -> list[Restored]:
    """Verify, check every member, then extract and swap each cache into place."""
    verify(folder, manifest)
    files, where, caps = {}, {}, {}
    for part in manifest.archives:
        if part.kind not in targets:
            raise InputError(f"no {part.kind} cache location in this environment")
        target = targets[part.kind]
        # A symlinked cache keeps its link: the cache is restored where it points.
        where[part.kind] = os.path.realpath(target) if os.path.islink(target) else target
        _refuse_target(where[part.kind])
        caps[part.kind] = restore_cap(where[part.kind])  # checked on the headers first
        files[part.kind] = check_members(folder / part.file, caps[part.kind])
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    done: list[Restored] = []
    for part in manifest.archives:
        target = where[part.kind]
        staging = f"{target}.restoring-{os.getpid()}"
        try:
            try:
                extract_into(folder / part.file, staging, caps[part.kind])
            except BaseException:
                shutil.rmtree(staging, ignore_errors=True)
                raise
            previous = swap_into_place(staging, target, stamp)  # never deletes what was there
        except (InputError, OutputError) as exc:
            if not done:
                raise
            kept = "; ".join(f"{d.kind} to {d.target}" + (f", previous kept at {d.previous}"
                                                          if d.previous else "") for d in done)
            raise type(exc)(f"{exc} (already restored: {kept})") from None
        done.append(Restored(kind=part.kind, target=target, files=files[part.kind],
                             previous=previous))
    return done


# -- provenance ----------------------------------------------------------------------------

def mark_saved(snapshot: Snapshot) -> list[Marked]:
    """After ``save``: the saved caches now carry this build's label, so their marker says
    so too; a cache whose marker names only other builds (stale) is left as it is."""
    return mark_snapshot(snapshot, kinds=tuple(c.kind for c in to_save(snapshot)),
                         skip_stale=True)


def mark_restored(done: list[Restored], manifest: Manifest) -> list[Marked]:
    """After ``restore``: each restored folder holds what the archive's build filled."""
    b = manifest.build
    if b.compat_key is None:
        return []
    stamp = BuildStamp(compat_key=b.compat_key, torch_version=b.torch_version,
                       torch_git_version=b.torch_git_version, triton_version=b.triton_version,
                       first_seen=manifest.created.split(".")[0].removesuffix("Z") + "Z")
    return [Marked(kind=d.kind, path=d.target, result=mark_folder(d.target, stamp))
            for d in done]
