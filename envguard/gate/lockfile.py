"""Lockfiles: known-good environments for one command, in reviewable TOML.

``lockfiles/NAME.toml`` holds one or more *entries* (the CPU CI environment, the
H200 environment, ...). An entry pins the interpreter, torch's identity (version,
git commit, CUDA), triton, the exact version and build fingerprint of every
distribution in the command's dependency closure, md5/sha256 of the listed files,
and the digest of the full snapshot it came from (kept next to the lock in
``lockfiles/NAME.snapshots/``). Forbidden packages and the compile-cache policy
apply to every entry. Locking again on another machine adds or replaces that
machine's entry and never drops the others.
"""

from __future__ import annotations

import dataclasses
import re
import sys
from dataclasses import field
from pathlib import Path
from typing import Any

from envguard.errors import InputError, UnsupportedSchemaError
from envguard.explain.tables import CACHE_POLICIES, DEFAULT_FORBIDDEN
from envguard.frozen import frozen
from envguard.gate.closure import closure, marker_environment, project_requires, split_root
from envguard.globs import matches_any
from envguard.input_file import METADATA_BYTES, NotReadable, read_bounded_text
from envguard.model import ProbeIssue, Snapshot
from envguard.names import normalize_name
from envguard.toml_write import toml_string

__all__ = ["DEFAULT_FORBIDDEN", "LOCK_SCHEMA", "Lock", "LockEntry", "LockedFile",
           "LockedPackage", "build_entry", "closure", "dump_lock", "hash_files",
           "marker_environment", "parse_lock", "pinned_names", "project_requires",
           "script_owner", "split_root", "validate_name"]

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

LOCK_SCHEMA = "envguard.lock/1"
SCOPE_CLOSURE, SCOPE_ENVIRONMENT = "closure", "environment"
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


@frozen
class LockedPackage:
    name: str
    version: str
    fingerprint: str | None = None


@frozen
class LockedFile:
    path: str
    """Relative to the project root (the folder that holds ``lockfiles/``)."""
    md5: str
    sha256: str


@frozen
class LockEntry:
    id: str
    """Which environment this is (``--entry``, default ``<host>-<cpu|cuXYZ>``)."""
    created_at: str
    python_implementation: str
    python_version: str
    """major.minor"""
    torch_version: str | None = None
    torch_git_version: str | None = None
    torch_cuda: str | None = None
    triton_version: str | None = None
    packages: tuple[LockedPackage, ...] = ()
    snapshot_digest: str | None = None
    snapshot_file: str | None = None
    """Relative to the lockfile's folder."""


@frozen
class Lock:
    name: str
    command: str
    distribution: str
    """The command's own distribution; its requirements define the closure."""
    extras: tuple[str, ...] = ()
    """Extras of ``distribution`` that the command needs (``dflash`` pulls in torch)."""
    requires: tuple[str, ...] = ()
    """More roots of the closure: the distributions ``-r`` files and further
    ``--distribution`` options named, each a name with its extras (``envguard[dflash]``)."""
    scope: str = "closure"
    """``closure``: the roots and what they require; ``environment``: every distribution."""
    cache_policy: str = "warn-if-cold"
    forbidden: tuple[str, ...] = DEFAULT_FORBIDDEN
    file_patterns: tuple[str, ...] = ()
    files: tuple[LockedFile, ...] = ()
    """md5/sha256 of the files matching ``file_patterns``: the project's, so shared by all
    entries and re-hashed from the working tree at every ``envguard lock``."""
    entries: tuple[LockEntry, ...] = field(default=())

    def with_entry(self, entry: LockEntry) -> Lock:
        """This lock with ``entry`` added, replacing an entry of the same id."""
        kept = tuple(e for e in self.entries if e.id != entry.id)
        return dataclasses.replace(self, entries=tuple(sorted((*kept, entry),
                                                             key=lambda e: e.id)))

    @property
    def whole_environment(self) -> bool:
        return self.scope == SCOPE_ENVIRONMENT

    def roots(self) -> tuple[str, ...]:
        """The closure's roots by name (for the gate's RECORD check)."""
        return (*((self.distribution,) if self.distribution else ()),
                *(split_root(r)[0] for r in self.requires))

    def forbidden_installed(self, snapshot: Snapshot) -> list[str]:
        return sorted(p.name for p in snapshot.packages
                      if matches_any(p.name, self.forbidden))


# ---------------------------------------------------------------------------- build

def default_entry_id(snapshot: Snapshot) -> str:
    build = (snapshot.torch.cuda and "cu" + snapshot.torch.cuda.replace(".", "")) or "cpu"
    host = re.sub(r"[^A-Za-z0-9_-]+", "-", snapshot.system.hostname) or "host"
    py = ".".join(snapshot.interpreter.version.split(".")[:2])
    return f"{host}-py{py}-{build}"


def hash_files(lock: Lock, project_root: Path,
               skip: tuple[Path, ...] = ()) -> tuple[LockedFile, ...]:
    """The lock's file patterns, hashed from the working tree; paths relative to the root.
    ``skip``: files and folders left out (the lock's own file and snapshots, which a
    pattern such as ``lockfiles/*`` matches but which change with every lock)."""
    from envguard.probe.files import track

    issues: list[ProbeIssue] = []
    tracked = track([str(project_root / p) for p in lock.file_patterns], issues)
    if issues:
        raise InputError(f"cannot hash the locked files: {issues[0].message} ({issues[0].path})")
    left_out = tuple(p.resolve() for p in skip)
    out = []
    for f in tracked:
        real = Path(f.path).resolve()
        if any(real == s or s in real.parents for s in left_out):
            continue
        if f.exists and f.md5 and f.sha256:
            rel = Path(f.path).resolve().relative_to(project_root.resolve()).as_posix()
            out.append(LockedFile(path=rel, md5=f.md5, sha256=f.sha256))
    return tuple(sorted(out, key=lambda f: f.path))


def pinned_names(snapshot: Snapshot, lock: Lock, project_root: Path, *,
                 locking: bool = False) -> set[str]:
    """What the lock pins in ``snapshot``: every distribution (scope ``environment``), or
    the closure of its roots. ``locking``: a root whose requirements are unknown (not
    installed, and not the project being developed) is an InputError."""
    if lock.whole_environment:
        return {p.name for p in snapshot.packages}
    installed = {p.name for p in snapshot.packages}
    names: set[str] = set()
    if lock.distribution:
        here = normalize_name(lock.distribution) in installed
        root_requires = None if here else project_requires(project_root, lock.distribution)
        if locking and not here and root_requires is None:
            raise InputError(f"{lock.distribution} is not installed in "
                             f"{snapshot.interpreter.executable} and is not the project in "
                             f"{project_root}: its requirements are unknown")
        names |= set(closure(snapshot, lock.distribution, lock.extras, root_requires))
    for root in lock.requires:
        name, extras = split_root(root)
        if locking and normalize_name(name) not in installed:
            raise InputError(f"{name} is not installed in {snapshot.interpreter.executable}: "
                             "install it, or leave it out of the lock")
        names |= set(closure(snapshot, name, extras))
    return names


def build_entry(snapshot: Snapshot, lock: Lock, *, entry_id: str | None,
                project_root: Path) -> LockEntry:
    names = sorted(pinned_names(snapshot, lock, project_root, locking=True))
    by_name = {p.name: p for p in snapshot.packages}
    packages = tuple(LockedPackage(name=n, version=by_name[n].version or "",
                                   fingerprint=by_name[n].fingerprint)
                     for n in names if not by_name[n].editable)
    t = snapshot.torch
    return LockEntry(
        id=entry_id or default_entry_id(snapshot),
        created_at=snapshot.created_at,
        python_implementation=snapshot.interpreter.implementation,
        python_version=".".join(snapshot.interpreter.version.split(".")[:2]),
        torch_version=t.version if t.present else None,
        torch_git_version=t.git_version if t.present else None,
        torch_cuda=t.cuda if t.present else None,
        triton_version=t.triton_version,
        packages=packages,
        snapshot_digest=snapshot.sha256,
    )


# ---------------------------------------------------------------------------- TOML

def _snapshot_file(value: str | None, ctx: str) -> str | None:
    """An entry's ``snapshot_file``: a path inside the lock's folder (``NAME.snapshots/ID.json``
    as ``envguard lock`` writes it), never an absolute path or one climbing out with ``..``."""
    if not value:
        return value  # none recorded (an empty string is read as written)
    parts = value.split("/")
    if (value.startswith("/") or "\\" in value or "\x00" in value
            or any(p in ("", ".", "..") for p in parts)):
        raise InputError(f"{ctx}.snapshot_file: {value[:80]!r} is not a path inside the "
                         "lock's folder")
    return value


def _get(data: dict[str, Any], key: str, tp: type, ctx: str, default: Any = ...) -> Any:
    if key not in data:
        if default is ...:
            raise InputError(f"{ctx}: missing '{key}'")
        return default
    value = data[key]
    if not isinstance(value, tp) or (isinstance(value, bool) and tp is not bool):
        raise InputError(f"{ctx}: '{key}' must be {tp.__name__}, not {type(value).__name__}")
    return value


def _str_list(data: dict[str, Any], key: str, ctx: str) -> tuple[str, ...]:
    value = _get(data, key, list, ctx, [])
    if not all(isinstance(v, str) for v in value):
        raise InputError(f"{ctx}: '{key}' must be a list of strings")
    return tuple(value)


def parse_lock(text: str, source: str) -> Lock:
    """A Lock from TOML text; InputError (exit 2) naming ``source`` for any problem."""
    from envguard.redact import redact_data

    try:  # a lock from a cloned repository shows no credential in any report
        data = redact_data(tomllib.loads(text))
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"{source}: not valid TOML: {exc}") from None
    except ValueError as exc:  # an integer longer than int() converts (4300 digits)
        raise InputError(f"{source}: not a usable lockfile: {exc}") from None
    except RecursionError:
        raise InputError(f"{source}: not a usable lockfile (nested too deeply)") from None
    schema = data.get("schema")
    match = re.fullmatch(r"envguard\.lock/([0-9]{1,6})(?:\.[0-9]{1,6})?", str(schema))
    if not isinstance(schema, str) or match is None:
        raise InputError(f"{source}: not an envguard lockfile (schema {schema!r})")
    if int(match.group(1)) > 1:
        raise UnsupportedSchemaError(f"{source}: lock schema {schema} is newer than this "
                                     f"envguard reads ({LOCK_SCHEMA}); upgrade envguard")
    policy = _get(data, "cache_policy", str, source, "warn-if-cold")
    if policy not in CACHE_POLICIES:
        raise InputError(f"{source}: cache_policy must be one of {', '.join(CACHE_POLICIES)}")
    entries = []
    for i, raw in enumerate(_get(data, "environment", list, source, [])):
        ctx = f"{source}: environment[{i}]"
        if not isinstance(raw, dict):
            raise InputError(f"{ctx}: must be a table")
        packages = tuple(LockedPackage(name=_get(p, "name", str, ctx),
                                       version=_get(p, "version", str, ctx),
                                       fingerprint=_get(p, "fingerprint", str, ctx, None))
                         for p in _tables(raw, "packages", ctx))
        entries.append(LockEntry(
            id=_get(raw, "id", str, ctx), created_at=_get(raw, "created_at", str, ctx, ""),
            python_implementation=_get(raw, "python_implementation", str, ctx),
            python_version=_get(raw, "python_version", str, ctx),
            torch_version=_get(raw, "torch_version", str, ctx, None),
            torch_git_version=_get(raw, "torch_git_version", str, ctx, None),
            torch_cuda=_get(raw, "torch_cuda", str, ctx, None),
            triton_version=_get(raw, "triton_version", str, ctx, None),
            packages=packages,
            snapshot_digest=_get(raw, "snapshot_digest", str, ctx, None),
            snapshot_file=_snapshot_file(_get(raw, "snapshot_file", str, ctx, None), ctx)))
    return Lock(name=_get(data, "name", str, source), command=_get(data, "command", str, source),
                distribution=_get(data, "distribution", str, source),
                extras=_str_list(data, "extras", source),
                requires=_str_list(data, "requires", source), scope=_scope(data, source),
                cache_policy=policy,
                forbidden=_str_list(data, "forbidden", source) if "forbidden" in data
                else DEFAULT_FORBIDDEN,
                file_patterns=_str_list(data, "files", source),
                files=tuple(LockedFile(path=_get(f, "path", str, source),
                                       md5=_get(f, "md5", str, source),
                                       sha256=_get(f, "sha256", str, source))
                            for f in _tables(data, "file", source)),
                entries=tuple(entries))


def _scope(data: dict[str, Any], source: str) -> str:
    scope = _get(data, "scope", str, source, SCOPE_CLOSURE)
    if scope not in (SCOPE_CLOSURE, SCOPE_ENVIRONMENT):
        raise InputError(f"{source}: scope must be {SCOPE_CLOSURE} or {SCOPE_ENVIRONMENT}")
    return str(scope)


def _tables(raw: dict[str, Any], key: str, ctx: str) -> list[dict[str, Any]]:
    items: list[Any] = _get(raw, key, list, ctx, [])
    tables = [i for i in items if isinstance(i, dict)]
    if len(tables) != len(items):
        raise InputError(f"{ctx}: '{key}' must be an array of tables")
    return tables


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return toml_string(value)
    if isinstance(value, (list, tuple)):
        if not value:
            return "[]"
        return "[\n" + "".join(f"    {_toml_value(v)},\n" for v in value) + "]"
    raise TypeError(f"cannot write {type(value).__name__} to TOML")


def dump_lock(lock: Lock) -> str:
    """Deterministic, reviewable TOML; keys with no value (None) are left out."""
    lines = ["# envguard lockfile: known-good environments for one command.",
             "# Regenerate with `envguard lock` (see docs/LOCK.md); review changes in PRs.",
             f"schema = {toml_string(LOCK_SCHEMA)}"]
    head: dict[str, object] = {"name": lock.name, "command": lock.command}
    if lock.whole_environment:  # written only where it is not the default
        head["scope"] = lock.scope
    head |= {"distribution": lock.distribution, "extras": list(lock.extras)}
    if lock.requires:
        head["requires"] = list(lock.requires)
    head |= {"cache_policy": lock.cache_policy,
            "forbidden": list(lock.forbidden), "files": list(lock.file_patterns)}
    lines += [f"{k} = {_toml_value(v)}" for k, v in head.items()]
    for fl in lock.files:
        lines += ["", "[[file]]", f"path = {toml_string(fl.path)}", f"md5 = {toml_string(fl.md5)}",
                  f"sha256 = {toml_string(fl.sha256)}"]
    for entry in lock.entries:
        lines += ["", "[[environment]]"]
        for f in dataclasses.fields(LockEntry):
            value = getattr(entry, f.name)
            if f.name == "packages" or value is None:
                continue
            lines.append(f"{f.name} = {_toml_value(value)}")
        for pkg in entry.packages:
            lines += ["", "[[environment.packages]]", f"name = {toml_string(pkg.name)}",
                      f"version = {toml_string(pkg.version)}"]
            if pkg.fingerprint is not None:
                lines.append(f"fingerprint = {toml_string(pkg.fingerprint)}")
    return "\n".join(lines) + "\n"


def validate_name(name: str, what: str = "lock name") -> str:
    """``name`` when it is safe as a file name (a lock's name, an entry id): 1-128 letters,
    digits, '.', '_' or '-', starting with a letter or digit (no '/', no '..' on its own, no
    control characters); else InputError (exit 2)."""
    from envguard.redact import redact_text

    if not _NAME_RE.fullmatch(name):
        raise InputError(f"{what} {redact_text(name[:200])!r} must be 1-128 letters, digits, "
                         "'.', '_' or '-', starting with a letter or digit")
    refuse_credential(name, what)
    return name


def refuse_credential(text: str, what: str) -> None:
    """InputError (exit 2) when ``text`` holds something shaped like a credential: a lock
    is committed and reviewed, so it never holds one (nor a name the check would show)."""
    from envguard.redact import redact_text

    masked = redact_text(text)
    if masked != text:
        raise InputError(f"{what} {masked[:200]!r} holds something shaped like a credential; "
                         "a lock never records one (rename it, or leave it out)")


def script_owner(snapshot: Snapshot, script: str) -> tuple[str, tuple[str, ...]] | None:
    """(distribution, extras) whose ``console_scripts`` entry point is ``script``."""
    for dist in snapshot.packages:
        path = Path(dist.location) / dist.metadata_dir / "entry_points.txt"
        try:  # bounded: a FIFO or /dev/zero planted here must not hang `envguard lock`
            text = read_bounded_text(path, limit=METADATA_BYTES, what="entry_points.txt")
        except (OSError, NotReadable):
            continue
        section = ""
        for line in text.splitlines():
            line = line.strip()
            if line.startswith("["):
                section = line.strip("[]").strip()
            elif section == "console_scripts" and "=" in line:
                name, _, target = line.partition("=")
                if name.strip() == script:
                    extras = re.findall(r"\[([^\]]*)\]", target)
                    found = tuple(e.strip() for e in extras[0].split(",")) if extras else ()
                    return dist.name, found
    return None
