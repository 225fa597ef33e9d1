"""The dependency closure of a command's distribution, from installed metadata.

``closure(snapshot, "envguard", ("dflash",))`` is every distribution that
``envguard[dflash]`` needs in the snapshotted environment, transitively, with PEP 508
markers evaluated for *that* interpreter (not envguard's own).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from envguard.atomic import write_text_atomic
from envguard.errors import EnvguardError
from envguard.model import Snapshot
from envguard.names import normalize_name

if TYPE_CHECKING:
    from packaging.markers import Marker

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


def marker_environment(snapshot: Snapshot) -> dict[str, str]:
    """PEP 508 marker values of the snapshotted interpreter (not envguard's own)."""
    interp = snapshot.interpreter
    version = interp.version
    # sysconfig platforms: linux-x86_64, macosx-14.0-arm64, win-amd64
    machine = interp.platform.rsplit("-", 1)[-1] if "-" in interp.platform else ""
    system = interp.platform.split("-", 1)[0]
    return {
        "implementation_name": interp.implementation,
        "implementation_version": version,
        "os_name": "nt" if system.startswith("win") else "posix",
        "platform_machine": machine,
        "platform_python_implementation": {"cpython": "CPython", "pypy": "PyPy"}.get(
            interp.implementation, interp.implementation),
        "platform_release": snapshot.system.kernel,
        "platform_system": {"linux": "Linux", "macosx": "Darwin", "win": "Windows"}.get(
            system, system.capitalize()),
        "platform_version": "",
        "python_full_version": version,
        "python_version": ".".join(version.split(".")[:2]),
        "sys_platform": {"linux": "linux", "macosx": "darwin", "win": "win32"}.get(
            system, system),
    }


def closure(snapshot: Snapshot, root: str, extras: tuple[str, ...] = (),
            root_requires: list[str] | None = None) -> list[str]:
    """Names of ``root`` and everything it requires, transitively, as installed.

    Requirements come from each installed distribution's Requires-Dist, with markers
    evaluated for the snapshotted interpreter and the extras that were asked for.
    ``root_requires`` stands in for the root's own Requires-Dist when the root is not
    installed there (envguard run from a source tree on the GPU machine).

    The answer is memoised on disk, keyed by everything it depends on: importing
    packaging's marker and requirement parsers alone costs 20-40 ms, a sixth of the
    gate's budget, and the installed set rarely changes between two launches.
    """
    env = marker_environment(snapshot)
    key_doc = json.dumps([root, sorted(extras), root_requires, env,
                          [(p.name, p.version, p.requires) for p in snapshot.packages]],
                         sort_keys=True)
    key = hashlib.sha256(key_doc.encode("utf-8", "surrogateescape")).hexdigest()[:24]
    from envguard.input_file import NotReadable, read_bounded
    from envguard.paths import memo_dir, private_folder
    from envguard.probe.fastpath.marshal_file import MEMO_BYTES

    folder = memo_dir()
    trusted = private_folder(folder)  # else no memo: one others could write is not read
    memo = folder / f"closure-{key}.json"
    try:
        cached = json.loads(read_bounded(memo, limit=MEMO_BYTES, what="memo file")) \
            if trusted else None
        if isinstance(cached, list) and all(isinstance(n, str) for n in cached):
            return cached
    except (OSError, NotReadable, ValueError, RecursionError):
        pass  # absent, not a regular file (a FIFO would block), damaged: no memo
    names = _closure(snapshot, root, extras, root_requires, env)
    if trusted:
        from envguard.probe.fastpath.prune import prune

        prune(folder)  # at most once a day: memo files unused for a month go
        with contextlib.suppress(EnvguardError):
            write_text_atomic(memo, json.dumps(names), state_root=folder)
    return names


def _closure(snapshot: Snapshot, root: str, extras: tuple[str, ...],
             root_requires: list[str] | None, env: dict[str, str]) -> list[str]:
    from packaging.requirements import InvalidRequirement, Requirement

    by_name = {p.name: p for p in snapshot.packages}
    wanted: dict[str, set[str]] = {normalize_name(root): set(extras)}
    queue = [normalize_name(root)]
    while queue:
        name = queue.pop()
        dist = by_name.get(name)
        if dist is not None:
            requires = dist.requires
        elif name == normalize_name(root) and root_requires is not None:
            requires = root_requires
        else:
            continue
        for text in requires:
            try:
                req = Requirement(text)
            except InvalidRequirement:
                continue
            if req.marker is not None and not _marker_ok(req.marker, env, wanted[name]):
                continue
            dep = normalize_name(req.name)
            new_extras = set(req.extras)
            if dep not in wanted:
                wanted[dep] = new_extras
                queue.append(dep)
            elif not new_extras <= wanted[dep]:
                wanted[dep] |= new_extras
                queue.append(dep)
    return sorted(n for n in wanted if n in by_name)


def split_root(root: str) -> tuple[str, tuple[str, ...]]:
    """``"envguard[dflash]"`` → ``("envguard", ("dflash",))``: a root of a lock's closure."""
    name, _, rest = root.partition("[")
    extras = tuple(e.strip() for e in rest.rstrip("]").split(",") if e.strip())
    return name.strip(), extras


def project_requires(project_root: Path, distribution: str) -> list[str] | None:
    """Requires-Dist of ``distribution`` read from the project's own pyproject.toml."""
    from envguard.input_file import read_input_text

    try:
        data = tomllib.loads(read_input_text(project_root / "pyproject.toml",
                                             what="pyproject.toml"))
    except (EnvguardError, tomllib.TOMLDecodeError):
        return None
    project = data.get("project", {})
    if not isinstance(project, dict):
        return None
    if normalize_name(str(project.get("name", ""))) != normalize_name(distribution):
        return None
    deps = project.get("dependencies", [])
    optional = project.get("optional-dependencies") or {}
    if not isinstance(deps, list) or not isinstance(optional, dict):
        return None
    reqs = [r for r in deps if isinstance(r, str)]
    for extra, items in optional.items():
        if not isinstance(items, list):
            continue
        for r in items:
            if not isinstance(r, str):
                continue
            # Its own marker in parentheses: "a or b" must not become "a or (b and extra)".
            req, _, marker = r.partition(";")
            reqs.append(f"{req.strip()} ; ({marker.strip()}) and extra == '{extra}'"
                        if marker.strip() else f"{req.strip()} ; extra == '{extra}'")
    return reqs


def _marker_ok(marker: Marker, env: dict[str, str], extras: set[str]) -> bool:
    from packaging.markers import InvalidMarker

    try:
        if not extras:
            return bool(marker.evaluate({**env, "extra": ""}))
        return any(marker.evaluate({**env, "extra": e}) for e in extras)
    except (InvalidMarker, ValueError, KeyError):
        return True
