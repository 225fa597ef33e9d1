"""``diff(old, new)``: every difference between two snapshots, as typed, plain data.

Pure: no I/O, no printing. Each :class:`Change` names its section, the key inside
it (a package, a variable, a file), an optional field, the kind of change and the
two values. ``material`` is False for differences that do not change behaviour on
their own (a cache that grew, the host name, who installed a package); those are
listed but do not make two snapshots "different".
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from envguard.frozen import frozen
from envguard.model import CacheDir, Distribution, EnvValue, Snapshot, TrackedFile

ADDED, REMOVED, CHANGED = "added", "removed", "changed"
MASKED = "<masked>"


@frozen
class Change:
    section: str
    key: str
    field: str | None = None
    kind: str = CHANGED
    old: Any = None
    new: Any = None
    material: bool = True

    @property
    def path(self) -> str:
        parts = [self.section, self.key] + ([self.field] if self.field else [])
        return ".".join(p for p in parts if p)


@frozen(kw_only=False)
class SnapshotDiff:
    changes: tuple[Change, ...]

    @property
    def material(self) -> tuple[Change, ...]:
        return tuple(c for c in self.changes if c.material)

    @property
    def equivalent(self) -> bool:
        return not self.material

    def find(self, section: str, key: str | None = None,
             field: str | None = None) -> list[Change]:
        return [c for c in self.changes if c.section == section
                and (key is None or c.key == key) and (field is None or c.field == field)]

    def first(self, section: str, key: str, field: str | None = None) -> Change | None:
        found = self.find(section, key, field)
        return found[0] if found else None


def _fields(section: str, old: object, new: object, names: Iterable[str],
            *, key: str = "", immaterial: frozenset[str] = frozenset()) -> Iterator[Change]:
    for name in names:
        a, b = getattr(old, name), getattr(new, name)
        if a != b:
            yield Change(section=section, key=key or name, field=name if key else None,
                         old=a, new=b, material=name not in immaterial)


def _interpreter(old: Snapshot, new: Snapshot) -> Iterator[Change]:
    yield from _fields("interpreter", old.interpreter, new.interpreter,
                       ("version", "implementation", "executable", "prefix", "base_prefix",
                        "is_venv", "best_tag", "sys_path"))


def _torch(old: Snapshot, new: Snapshot) -> Iterator[Change]:
    yield from _fields("torch", old.torch, new.torch,
                       ("present", "version", "git_version", "cuda", "hip", "debug",
                        "dist_version", "triton_version", "triton_fingerprint",
                        "cuda_wheel_family", "compat_key", "location"),
                       immaterial=frozenset({"location"}))
    a, b = set(old.torch.cuda_wheels), set(new.torch.cuda_wheels)
    if a != b:
        yield Change(section="torch", key="cuda_wheels", old=sorted(a - b), new=sorted(b - a))


def _direct_url(d: Distribution) -> str | None:
    u = d.direct_url
    if u is None:
        return None
    return " ".join(x for x in (u.url, u.commit_id, u.archive_hash) if x)


def _packages(old: Snapshot, new: Snapshot) -> Iterator[Change]:
    a = {p.name: p for p in old.packages}
    b = {p.name: p for p in new.packages}
    for name in sorted(a.keys() | b.keys()):
        if name not in b:
            yield Change(section="packages", key=name, kind=REMOVED, old=a[name].version)
            continue
        if name not in a:
            yield Change(section="packages", key=name, kind=ADDED, new=b[name].version)
            continue
        p, q = a[name], b[name]
        yield from _fields("packages", p, q, ("version", "editable", "shadowed", "installer",
                                              "requested", "location"), key=name,
                           immaterial=frozenset({"installer", "requested", "location"}))
        if p.version == q.version and p.fingerprint and q.fingerprint \
                and p.fingerprint != q.fingerprint:
            yield Change(section="packages", key=name, field="fingerprint", old=p.fingerprint,
                         new=q.fingerprint)
        if _direct_url(p) != _direct_url(q):
            yield Change(section="packages", key=name, field="direct_url", old=_direct_url(p),
                         new=_direct_url(q))


def _conda(old: Snapshot, new: Snapshot) -> Iterator[Change]:
    a = {p.name: p for p in old.conda}
    b = {p.name: p for p in new.conda}
    for name in sorted(a.keys() | b.keys()):
        if name not in b:
            yield Change(section="conda", key=name, kind=REMOVED, old=a[name].version)
        elif name not in a:
            yield Change(section="conda", key=name, kind=ADDED, new=b[name].version)
        else:
            p, q = a[name], b[name]
            yield from _fields("conda", p, q, ("version", "build", "channel", "pip_also",
                                               "requested_spec", "subdir"), key=name,
                               immaterial=frozenset({"requested_spec"}))
            if p.version == q.version and p.build == q.build and p.fingerprint \
                    and q.fingerprint and p.fingerprint != q.fingerprint:
                yield Change(section="conda", key=name, field="fingerprint",
                             old=p.fingerprint, new=q.fingerprint)


def _integrity(old: Snapshot, new: Snapshot) -> Iterator[Change]:
    if "none" in (old.integrity.mode, new.integrity.mode):
        return
    a = {(i.package, i.path): i.problem for i in old.integrity.issues}
    b = {(i.package, i.path): i.problem for i in new.integrity.issues}
    for key in sorted(a.keys() | b.keys()):
        if a.get(key) != b.get(key):
            kind = ADDED if key not in a else REMOVED if key not in b else CHANGED
            yield Change(section="integrity", key=key[0], field=key[1], kind=kind,
                         old=a.get(key), new=b.get(key))


def cache_state(c: CacheDir | None) -> dict[str, Any] | None:
    if c is None or not c.exists:
        return None
    return {"path": c.path, "bytes": c.total_bytes, "files": c.files}


def _caches(old: Snapshot, new: Snapshot) -> Iterator[Change]:
    a = {c.kind: c for c in old.caches}
    b = {c.kind: c for c in new.caches}
    for kind in sorted(a.keys() | b.keys()):
        p, q = a.get(kind), b.get(kind)
        if p is not None and q is not None and p.path != q.path:
            yield Change(section="caches", key=kind, field="path", old=p.path, new=q.path)
        was_full = p is not None and p.exists and p.files > 0
        is_full = q is not None and q.exists and q.files > 0
        sp, sq = cache_state(p), cache_state(q)
        if sp != sq:
            # Growth of a warm cache is normal use; emptying or filling one is not.
            yield Change(section="caches", key=kind, field="contents", old=sp, new=sq,
                         material=was_full != is_full)
        if p is not None and q is not None and p.filesystem != q.filesystem:
            yield Change(section="caches", key=kind, field="filesystem", old=p.filesystem,
                         new=q.filesystem)
        pa = [s.compat_key for s in p.populated_under] if p else []
        pb = [s.compat_key for s in q.populated_under] if q else []
        if pa != pb:
            yield Change(section="caches", key=kind, field="populated_under", old=pa, new=pb,
                         material=False)


def _file_digest(f: TrackedFile) -> dict[str, Any] | None:
    return {"md5": f.md5, "sha256": f.sha256, "size": f.size} if f.exists else None


def _files(old: Snapshot, new: Snapshot) -> Iterator[Change]:
    a = {f.path: f for f in old.files.files}
    b = {f.path: f for f in new.files.files}
    for path in sorted(a.keys() | b.keys()):
        da = _file_digest(a[path]) if path in a else None
        db = _file_digest(b[path]) if path in b else None
        if path in a and path in b and da != db:
            kind = REMOVED if db is None else ADDED if da is None else CHANGED
            yield Change(section="files", key=path, kind=kind, old=da, new=db)
        elif path not in a and db is not None:
            yield Change(section="files", key=path, kind=ADDED, new=db, material=False)
        elif path not in b and da is not None:
            yield Change(section="files", key=path, kind=REMOVED, old=da, material=False)
    ga, gb = old.files.git, new.files.git
    if ga is not None and gb is not None:
        yield from _fields("git", ga, gb, ("commit", "branch", "dirty"), key="repository")


def _gpu_summary(s: Snapshot) -> list[str]:
    return [f"{g.name} ({g.memory_mib} MiB, sm {g.compute_capability})" for g in s.system.gpus]


def _system(old: Snapshot, new: Snapshot) -> Iterator[Change]:
    # How nvidia-smi answered (absent, unreadable, no devices) is no change of GPUs when
    # neither side lists one.
    no_gpus = ("gpu_probe",) if not old.system.gpus and not new.system.gpus else ()
    yield from _fields("system", old.system, new.system,
                       ("gpu_probe", "driver_version", "cuda_driver_version", "nvcc",
                        "cuda_home", "os", "kernel", "glibc", "machine", "cpu_model",
                        "cpu_logical", "memory_bytes", "hostname"),
                       immaterial=frozenset({"hostname", "memory_bytes", "cpu_logical",
                                             "kernel", "cuda_home", *no_gpus}))
    ga, gb = _gpu_summary(old), _gpu_summary(new)
    if ga != gb:
        yield Change(section="system", key="gpus", old=ga, new=gb)


def _env_value(v: EnvValue | None) -> str | None:
    if v is None:
        return None
    return v.value if not v.masked or v.value else MASKED


def _environment(old: Snapshot, new: Snapshot) -> Iterator[Change]:
    a, b = old.environment.variables, new.environment.variables
    comparable = old.environment.mask_key_id == new.environment.mask_key_id
    for name in sorted(a.keys() | b.keys()):
        p, q = a.get(name), b.get(name)
        if p is None or q is None:
            yield Change(section="environment", key=name, kind=ADDED if p is None else REMOVED,
                         old=_env_value(p), new=_env_value(q))
        elif p.masked or q.masked:
            # Digests compare under one key, and only where both sides have one (a value
            # masked while an old file was read may have none): else the visible values.
            if not comparable or (p.masked and not p.digest) or (q.masked and not q.digest):
                if p.value != q.value:
                    yield Change(section="environment", key=name, old=_env_value(p),
                                 new=_env_value(q))
            elif p.digest != q.digest:
                yield Change(section="environment", key=name, old=_env_value(p),
                             new=_env_value(q) if p.value != q.value else "<masked, changed>")
        elif p.value != q.value:
            yield Change(section="environment", key=name, old=p.value, new=q.value)


def _deep(old: Snapshot, new: Snapshot) -> Iterator[Change]:
    if old.deep is None or new.deep is None or not (old.deep.ok and new.deep.ok):
        return
    yield from _fields("deep", old.deep, new.deep,
                       ("cuda_available", "device_count", "device_capability", "cudnn_version",
                        "nccl_version", "torch_key"))


_SECTIONS = (_interpreter, _torch, _packages, _conda, _integrity, _caches, _files, _system,
             _environment, _deep)


def diff(old: Snapshot, new: Snapshot) -> SnapshotDiff:
    """Every difference between ``old`` and ``new``, in a fixed section order."""
    return SnapshotDiff(tuple(c for section in _SECTIONS for c in section(old, new)))
