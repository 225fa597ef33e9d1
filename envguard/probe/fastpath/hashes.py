"""A persistent memo of file digests keyed by (path, size, mtime_ns, ctime_ns, inode).

A warm ``--verify hash`` re-run on an unchanged environment only stats files.
The ctime is part of the key because it cannot be set from user space: a file
edited and then ``touch``-ed back to its old mtime is still re-hashed.

The memo is a ``marshal`` file (loads 70,000 entries in a few milliseconds, where
JSON takes tens): private to this machine, tagged with the marshal version, and
simply ignored when unreadable or of another format. A save drops the entries of files
that are gone (an uninstalled or upgraded package's), so the memo does not grow with every
version an environment has held.
"""

from __future__ import annotations

import os
from pathlib import Path

from envguard.paths import memo_dir
from envguard.probe.fastpath import marshal_file
from envguard.probe.fastpath.marshal_file import Key, prefix_digest


class HashMemo:
    """Digests of files of one environment (one memo file per interpreter prefix)."""

    TAG = ("envguard-hashcache", 2)  # the file format's tag: existing memo files stay valid

    def __init__(self, path: Path) -> None:
        self.path = path
        self._entries: dict[str, tuple[Key, str]] = {}
        self._used: set[str] = set()
        self._dirty = False
        self.load_error: str | None = None

    @classmethod
    def for_prefix(cls, prefix: str, root: Path | None = None) -> HashMemo:
        memo = cls((root or memo_dir()) / f"hashes-{prefix_digest(prefix)}.marshal")
        memo.load()
        return memo

    def load(self) -> None:
        self._entries, self.load_error = marshal_file.load(self.path, self.TAG)

    def get(self, path: str, key: Key, algorithm: str) -> str | None:
        name = f"{algorithm}:{path}"
        hit = self._entries.get(name)
        # Entries are checked on use, not on load: a malformed one is just a miss.
        if type(hit) is tuple and len(hit) == 2 and hit[0] == key and type(hit[1]) is str:
            self._used.add(name)
            return hit[1]
        return None

    def put(self, path: str, key: Key, algorithm: str, digest: str) -> None:
        name = f"{algorithm}:{path}"
        self._entries[name] = (key, digest)
        self._used.add(name)
        self._dirty = True

    def save(self) -> str | None:
        """Write the memo atomically if it changed; return an error message, never raise."""
        if not self._dirty:
            return None
        for name in [n for n in self._entries if n not in self._used]:
            if not os.path.lexists(name.partition(":")[2]):  # gone since it was hashed
                del self._entries[name]
        error = marshal_file.save(self.path, self.TAG, self._entries)
        if error is None:
            self._dirty = False
        return error

