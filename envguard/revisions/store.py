"""The revisions of one environment: before and after snapshots of every change envguard
made to it, like ``conda list --revisions``.

Layout, per environment, under envguard's user folder (:func:`envguard.paths.user_dir`,
``~/.cache/envguard`` by default): ``revisions/<P>/`` where P is 16 hex digits of the
SHA-256 of the environment's real path (as the memo files name environments). Not under
the project's ``.envguard/``: an environment is changed from any working directory, and
its history must be found from all of them.

- ``rev-NNNNNN.json`` (``envguard.revision/1``): one change: the kind (``install``,
  ``undo``, ``restore``), the redacted command, its exit status, start and end time, the
  digests of the snapshots before and after, and the package changes in one line each.
- ``snapshots/sha256-<hex>.json``: each snapshot once, by content
  (:func:`envguard.runs.store.content_digest`).
- ``environment.txt``: the environment's path, for a person looking at the folder.

Revision 0 is the state before the first recorded change: revision N's ``before``.
Every file is written as state (:mod:`envguard.atomic`'s ``state_root``): a symlink in
there is refused, never followed.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from envguard.atomic import check_state_path, write_text_atomic
from envguard.changes import ADDED, REMOVED, diff
from envguard.errors import InputError
from envguard.frozen import frozen
from envguard.input_file import read_input_text
from envguard.model import Snapshot
from envguard.paths import user_dir
from envguard.redact import redact_argv, redact_data
from envguard.runs.store import content_digest, now_iso

REVISION_SCHEMA = "envguard.revision/1"
LIST_SCHEMA = "envguard.revisions/1"
_RECORD = re.compile(r"rev-(\d{6})\.json")
_DIGEST = re.compile(r"sha256-[0-9a-f]{64}")
MAX_RECORD_BYTES = 1 << 20


@frozen
class Revision:
    number: int
    kind: str
    """``install``, ``undo`` or ``restore``."""
    argv: tuple[str, ...]
    """Redacted."""
    exit_code: int | None
    started_at: str
    ended_at: str
    before: str
    after: str
    """Snapshot digests (``sha256-<hex>``)."""
    changes: tuple[str, ...]
    """One line per package: ``+name 1.0``, ``-name 1.0``, ``name 1.0 → 2.0``,
    ``name 1.0 (another build)``."""
    note: str = ""
    """Where the result differed from the prediction, or what could not be restored."""

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["argv"], data["changes"] = list(self.argv), list(self.changes)
        return {"schema": REVISION_SCHEMA, **data}


@frozen
class RevisionList:
    """``envguard revisions``: an environment's recorded changes, oldest first."""

    environment: str
    revisions: tuple[Revision, ...]
    folder: str

    def to_dict(self) -> dict[str, Any]:
        return {"schema": LIST_SCHEMA, "environment": self.environment, "folder": self.folder,
                "revisions": [r.to_dict() for r in self.revisions]}


def state_root() -> Path:
    return user_dir()


def env_folder(prefix: str | os.PathLike[str]) -> Path:
    """``<user dir>/revisions/<P>``: see the module."""
    key = hashlib.sha256(os.path.realpath(prefix).encode("utf-8", "surrogateescape"))
    return state_root() / "revisions" / key.hexdigest()[:16]


def change_lines(before: Snapshot, after: Snapshot) -> tuple[str, ...]:
    """The package changes from ``before`` to ``after``, one line per package."""
    lines: dict[str, str] = {}
    for c in diff(before, after).material:
        if c.section != "packages":
            continue
        if c.kind == ADDED:
            lines[c.key] = f"+{c.key} {c.new}"
        elif c.kind == REMOVED:
            lines[c.key] = f"-{c.key} {c.old}"
        elif c.field == "version":
            lines[c.key] = f"{c.key} {c.old} → {c.new}"
        elif c.key not in lines:
            old = before.package(c.key)
            what = "another build" if c.field == "fingerprint" else f"{c.field} changed"
            lines[c.key] = f"{c.key} {old.version if old else '?'} ({what})"
    return tuple(lines[k] for k in sorted(lines))


def store_snapshot(snapshot: Snapshot, folder: Path) -> str:
    digest = content_digest(snapshot)
    path = folder / "snapshots" / f"{digest}.json"
    check_state_path(path, state_root())
    if not path.is_file():
        write_text_atomic(path, snapshot.to_json(), mode=0o600, state_root=state_root())
    return digest


def record_revision(prefix: str, before: Snapshot, after: Snapshot, *, kind: str,
                    argv: Sequence[str], exit_code: int | None, started_at: str,
                    note: str = "") -> Revision:
    """Write the next revision of the environment at ``prefix``."""
    folder = env_folder(prefix)
    marker = folder / "environment.txt"
    check_state_path(marker, state_root())
    if not marker.is_file():
        write_text_atomic(marker, os.path.realpath(prefix) + "\n", mode=0o600,
                          state_root=state_root())
    rev = Revision(number=_next_number(folder), kind=kind,
                   argv=tuple(redact_argv(list(argv))), exit_code=exit_code,
                   started_at=started_at, ended_at=now_iso(),
                   before=store_snapshot(before, folder), after=store_snapshot(after, folder),
                   changes=change_lines(before, after), note=note)
    write_text_atomic(folder / f"rev-{rev.number:06d}.json",
                      json.dumps(rev.to_dict(), indent=2, sort_keys=True) + "\n", mode=0o600,
                      state_root=state_root())
    return rev


def _next_number(folder: Path) -> int:
    numbers = [int(m.group(1)) for p in (folder.iterdir() if folder.is_dir() else ())
               if (m := _RECORD.fullmatch(p.name))]
    return max(numbers, default=0) + 1


def _str(data: dict[str, Any], key: str) -> str:
    value = data.get(key)
    if not isinstance(value, str):
        raise InputError(f"revision: {key} is not a string")
    return value


def parse_revision(text: str, number: int) -> Revision:
    try:
        data = json.loads(text)
    except ValueError:
        raise InputError(f"revision {number}: not valid JSON") from None
    if not isinstance(data, dict) or data.get("schema") != REVISION_SCHEMA:
        raise InputError(f"revision {number}: not an envguard revision")
    argv, changes, code = data.get("argv"), data.get("changes"), data.get("exit_code")
    if not (isinstance(argv, list) and isinstance(changes, list)
            and (code is None or (isinstance(code, int) and not isinstance(code, bool)))):
        raise InputError(f"revision {number}: malformed")
    before, after = _str(data, "before"), _str(data, "after")
    if not (_DIGEST.fullmatch(before) and _DIGEST.fullmatch(after)):
        raise InputError(f"revision {number}: malformed snapshot digest")
    return redact_data(Revision(
        number=number, kind=_str(data, "kind"), argv=tuple(redact_argv([str(a) for a in argv])),
        exit_code=code, started_at=_str(data, "started_at"), ended_at=_str(data, "ended_at"),
        before=before, after=after, changes=tuple(str(c) for c in changes),
        note=str(data.get("note") or "")))


def list_revisions(prefix: str) -> RevisionList:
    """The environment's revisions, oldest first (an unreadable record is skipped)."""
    folder = env_folder(prefix)
    found = []
    if folder.is_dir():
        for path in sorted(folder.iterdir()):
            m = _RECORD.fullmatch(path.name)
            if not m:
                continue
            try:
                found.append(parse_revision(read_input_text(
                    path, what="revision", limit=MAX_RECORD_BYTES, follow=False), int(m.group(1))))
            except InputError:
                continue
    return RevisionList(environment=os.path.realpath(prefix), revisions=tuple(found),
                        folder=str(folder))


def load_snapshot(prefix: str, digest: str) -> Snapshot:
    """A stored snapshot of the environment, by digest (InputError when it is gone)."""
    from envguard.snapshot_file import read_snapshot

    if not _DIGEST.fullmatch(digest):
        raise InputError(f"not a snapshot digest: {digest}")
    return read_snapshot(env_folder(prefix) / "snapshots" / f"{digest}.json", follow=False)


def state_of(revisions: RevisionList, number: int) -> str:
    """The digest of the environment's state at revision ``number`` (0: before the first
    change); InputError for a revision not recorded."""
    by_number = {r.number: r for r in revisions.revisions}
    if number == 0 and revisions.revisions:
        return revisions.revisions[0].before
    if number not in by_number:
        known = ", ".join(str(n) for n in (0, *by_number)) if by_number else "none"
        raise InputError(f"no revision {number} of {revisions.environment} (recorded: {known})")
    return by_number[number].after
