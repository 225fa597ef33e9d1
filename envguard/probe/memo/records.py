"""Parsed RECORDs, memoised by the RECORD file's stat key.

Parsing, filtering and fingerprinting 30,000 RECORD rows takes about 50 ms; an
installer rewrites RECORD on every install, so an unchanged (size, mtime, ctime,
inode) means an unchanged parse. One memo file per environment prefix.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from envguard.paths import memo_dir
from envguard.probe.memo import marshal_file
from envguard.probe.memo.marshal_file import Key, prefix_digest

RecordRow = tuple[str, str, str]
Parsed = tuple[int, list[RecordRow], str]
"""(rows in RECORD, fingerprinted rows, fingerprint)."""


class RecordMemo:
    TAG = ("envguard-records", 1)  # the file format's tag: existing memo files stay valid

    def __init__(self, path: Path) -> None:
        self.path = path
        self._entries: dict[str, Any]
        self._entries, self.load_error = marshal_file.load(path, self.TAG)
        self._used: set[str] = set()
        self._dirty = False

    @classmethod
    def for_prefix(cls, prefix: str, root: Path | None = None) -> RecordMemo:
        return cls((root or memo_dir()) / f"records-{prefix_digest(prefix)}.marshal")

    def get(self, record_path: str, key: Key) -> Parsed | None:
        hit = self._entries.get(record_path)
        if type(hit) is tuple and len(hit) == 2 and hit[0] == key and type(hit[1]) is tuple \
                and len(hit[1]) == 3:
            self._used.add(record_path)
            return hit[1]
        return None

    def put(self, record_path: str, key: Key, parsed: Parsed) -> None:
        self._entries[record_path] = (key, parsed)
        self._used.add(record_path)
        self._dirty = True

    def save(self) -> str | None:
        """Write if anything changed, dropping RECORDs that no longer exist in this env."""
        stale = set(self._entries) - self._used
        if not self._dirty and not stale:
            return None
        kept = {k: v for k, v in self._entries.items() if k in self._used}
        error = marshal_file.save(self.path, self.TAG, kept)
        if error is None:
            self._entries, self._dirty = kept, False
        return error
