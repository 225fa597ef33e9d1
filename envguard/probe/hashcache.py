"""A persistent cache of file digests keyed by (path, size, mtime_ns, ctime_ns, inode).

A warm ``--verify hash`` re-run on an unchanged environment only stats files.
The ctime is part of the key because it cannot be set from user space: a file
edited and then ``touch``-ed back to its old mtime is still re-hashed.

The cache is a ``marshal`` file (loads 70,000 entries in a few milliseconds, where
JSON takes tens): private to this machine, tagged with the marshal version, and
simply ignored when unreadable or of another format.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from envguard.probe import marshalstore

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

    TAG = ("envguard-hashcache", 2)

    def __init__(self, path: Path) -> None:
        self.path = path
        self._entries: dict[str, tuple[Key, str]] = {}
        self._dirty = False
        self.load_error: str | None = None

    @classmethod
    def for_prefix(cls, prefix: str, root: Path | None = None) -> HashCache:
        cache = cls((root or default_cache_root()) / f"hashes-{prefix_digest(prefix)}.marshal")
        cache.load()
        return cache

    def load(self) -> None:
        self._entries, self.load_error = marshalstore.load(self.path, self.TAG)

    def get(self, path: str, key: Key, algorithm: str) -> str | None:
        hit = self._entries.get(f"{algorithm}:{path}")
        # Entries are checked on use, not on load: a malformed one is just a miss.
        if type(hit) is tuple and len(hit) == 2 and hit[0] == key and type(hit[1]) is str:
            return hit[1]
        return None

    def put(self, path: str, key: Key, algorithm: str, digest: str) -> None:
        self._entries[f"{algorithm}:{path}"] = (key, digest)
        self._dirty = True

    def save(self) -> str | None:
        """Write the cache atomically if it changed; return an error message, never raise."""
        if not self._dirty:
            return None
        error = marshalstore.save(self.path, self.TAG, self._entries)
        if error is None:
            self._dirty = False
        return error


def prefix_digest(prefix: str) -> str:
    """A short stable name for one environment's cache files."""
    return hashlib.sha256(os.path.realpath(prefix).encode()).hexdigest()[:16]
