"""A persistent cache of file digests keyed by (path, size, mtime_ns, ctime_ns, inode).

A warm ``--verify hash`` re-run on an unchanged environment only stats files.
The ctime is part of the key because it cannot be set from user space: a file
edited and then ``touch``-ed back to its old mtime is still re-hashed.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from envguard.atomic import write_text_atomic
from envguard.errors import OutputError

_FORMAT = 1
Key = tuple[int, int, int, int]


def default_cache_root() -> Path:
    """``$ENVGUARD_CACHE_DIR``, else ``$XDG_CACHE_HOME/envguard``, else ``~/.cache/envguard``."""
    explicit = os.environ.get("ENVGUARD_CACHE_DIR")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".cache"
    return base / "envguard"


def stat_key(st: os.stat_result) -> Key:
    return (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)


class HashCache:
    """Digests of files of one environment (one cache file per interpreter prefix)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._entries: dict[str, tuple[Key, str]] = {}
        self._dirty = False
        self.load_error: str | None = None

    @classmethod
    def for_prefix(cls, prefix: str, root: Path | None = None) -> HashCache:
        digest = hashlib.sha256(os.path.realpath(prefix).encode()).hexdigest()[:16]
        cache = cls((root or default_cache_root()) / f"hashes-{digest}.json")
        cache.load()
        return cache

    def load(self) -> None:
        try:
            raw = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return
        except (OSError, ValueError) as exc:
            # A corrupt cache is only a slower run: start empty and overwrite it.
            self.load_error = f"hash cache {self.path} ignored: {exc}"
            return
        if not isinstance(raw, dict) or raw.get("format") != _FORMAT:
            return
        entries = raw.get("entries")
        if not isinstance(entries, dict):
            return
        for path, value in entries.items():
            if (
                isinstance(value, list)
                and len(value) == 5
                and all(isinstance(v, int) for v in value[:4])
                and isinstance(value[4], str)
            ):
                self._entries[path] = ((value[0], value[1], value[2], value[3]), value[4])

    def get(self, path: str, key: Key, algorithm: str) -> str | None:
        hit = self._entries.get(f"{algorithm}:{path}")
        if hit is not None and hit[0] == key:
            return hit[1]
        return None

    def put(self, path: str, key: Key, algorithm: str, digest: str) -> None:
        self._entries[f"{algorithm}:{path}"] = (key, digest)
        self._dirty = True

    def save(self) -> str | None:
        """Write the cache if it changed; return an error message instead of raising."""
        if not self._dirty:
            return None
        doc = {
            "format": _FORMAT,
            "entries": {p: [*k, d] for p, (k, d) in sorted(self._entries.items())},
        }
        try:
            write_text_atomic(self.path, json.dumps(doc, separators=(",", ":")))
        except OutputError as exc:
            return str(exc)
        self._dirty = False
        return None
