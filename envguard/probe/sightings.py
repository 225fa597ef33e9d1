"""Which builds envguard has seen each compile cache under: envguard's own state.

A snapshot that finds a non-empty inductor or triton cache remembers, in
``<user dir>/cache-sightings.json`` (:func:`envguard.paths.user_dir`), that it saw that
folder (keyed by its real path) under the current build. Nothing is written into the
cache itself: a sighting only says envguard looked, not that this build filled the
cache. ``envguard cache status`` calls such a cache ``seen``; ``valid`` needs provenance
recorded where envguard filled or restored the cache (:mod:`envguard.cache.provenance`).

The file is written only when a sighting is new, atomically; two snapshots racing may
lose one sighting (a later snapshot records it again). Unreadable or corrupt state is
treated as empty; a state that cannot be written is skipped: remembering only informs.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from envguard.errors import InputError, OutputError

FILE_NAME = "cache-sightings.json"
SCHEMA = "envguard.cache-sightings/1"
MAX_BYTES = 1 << 20
MAX_PATHS = 500
"""Oldest-first eviction past this many cache folders."""
MAX_BUILDS = 16
"""Builds remembered per cache folder (the oldest go first)."""


def state_file(root: Path | None = None) -> Path:
    if root is None:
        from envguard.paths import user_dir

        root = user_dir()
    return root / FILE_NAME


def load(root: Path | None = None) -> dict[str, list[dict[str, str]]]:
    """Real path -> [{compat_key, torch_version, last_seen}], oldest first; {} when none."""
    from envguard.input_file import read_input
    from envguard.paths import private_folder

    if not private_folder(state_file(root).parent):
        return {}  # a folder others could write to is not believed
    try:
        doc = json.loads(read_input(state_file(root), limit=MAX_BYTES))
    except (InputError, ValueError, RecursionError):
        return {}
    caches = doc.get("caches") if isinstance(doc, dict) else None
    out: dict[str, list[dict[str, str]]] = {}
    for path, builds in (caches.items() if isinstance(caches, dict) else ()):
        if not isinstance(builds, list):
            continue
        kept = [{k: v for k, v in b.items() if isinstance(v, str)} for b in builds
                if isinstance(b, dict) and isinstance(b.get("compat_key"), str)]
        if kept:
            out[str(path)] = kept[-MAX_BUILDS:]
    return out


def key_of(path: str) -> str:
    return os.path.realpath(path)


def seen_under(state: dict[str, list[dict[str, str]]], path: str, compat_key: str | None) -> bool:
    if compat_key is None:
        return False
    return any(b.get("compat_key") == compat_key for b in state.get(key_of(path), ()))


def remember(seen: list[tuple[str, str, str | None]], root: Path | None = None) -> bool:
    """Record (cache path, compat key, torch version) sightings; True when the file changed."""
    from envguard.paths import private_folder

    if not seen or not private_folder(state_file(root).parent):
        return False
    state = load(root)
    changed = False
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    for path, key, version in seen:
        if seen_under(state, path, key):
            continue
        builds = state.pop(key_of(path), [])  # re-inserted last: the newest sighting
        entry = {"compat_key": key, "first_seen": now}
        if version is not None:
            entry["torch_version"] = version
        state[key_of(path)] = [*builds, entry][-MAX_BUILDS:]
        changed = True
    if not changed:
        return False
    while len(state) > MAX_PATHS:
        state.pop(next(iter(state)))
    from envguard.atomic import write_text_atomic

    target = state_file(root)
    try:
        write_text_atomic(target, json.dumps({"schema": SCHEMA, "caches": state},
                                             indent=1) + "\n", state_root=target.parent)
    except (OSError, OutputError):
        return False
    return True
