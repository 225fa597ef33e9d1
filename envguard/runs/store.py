"""The record of guarded runs: one small JSON record per run, snapshots stored once by content.

Layout, under the project's ``.envguard/`` (:mod:`envguard.paths`):

- ``runs/<UTC stamp>-<lock>.run.json``: one record per ``envguard run`` (schema
  ``envguard.run/2``): the redacted argv, start and end time, exit status or signal, the
  gate's verdict and the snapshot's digest.
- ``snapshots/by-digest/sha256-<hex>.json``: the snapshot a run verified, named by the
  digest of its content (its creation time, duration and timings left out), so identical
  environments are stored once however many runs verified them.
- ``runs/last-good.json``: a pointer (``envguard.last-good/1``) to the newest run that passed
  the gate, unforced, and exited 0.

Every file is written through :mod:`envguard.atomic`, mode 0600, as state: a symlink in
``.envguard/`` (the folder itself, ``runs/``, a record, ``last-good.json``, a stored
snapshot) is refused (exit 5), never written through.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import shlex
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from envguard.atomic import check_state_path, sweep_stale_temps, write_text_atomic
from envguard.errors import InputError
from envguard.frozen import frozen
from envguard.input_file import read_input_text
from envguard.model import Snapshot
from envguard.paths import (
    FLEET_DIR,
    PROJECT_DIR,
    RUNS_DIR,
    SNAPSHOT_BY_DIGEST_DIR,
    SNAPSHOT_DIR,
)
from envguard.redact import redact_argv, redact_data, redact_text

RUN_SCHEMA = "envguard.run/2"
POINTER_SCHEMA = "envguard.last-good/1"
LAST_GOOD = "last-good.json"
RECORD_SUFFIX = ".run.json"
MAX_RECORD_BYTES = 1 << 20
_DIGEST = re.compile(r"sha256-[0-9a-f]{64}")


@frozen
class RunRecord:
    """One guarded run, as recorded."""

    id: str
    """The record's file name without ``.run.json``: ``<UTC stamp>-<lock>``."""
    argv: tuple[str, ...]
    """Redacted."""
    lock: str | None
    lockfile: str | None
    entry: str | None
    started_at: str
    ended_at: str
    exit_code: int | None
    """Shell-style: 128 + N when killed by signal N; None when the gate refused."""
    signal: str | None
    """``SIGTERM`` when the child died of a signal."""
    passed: bool
    forced: bool
    findings: tuple[str, ...]
    snapshot: str
    """``sha256-<hex>`` (a file of the store), or a file name in ``runs/`` (old records)."""
    stderr_tail: tuple[str, ...] = ()
    """The last lines the command wrote to stderr (at most :data:`TAIL_LINES`, redacted):
    the error of a failed run, used as its symptom."""

    @property
    def succeeded(self) -> bool:
        """Passed the gate unforced and exited 0: the only runs ``last-good`` points at."""
        return self.passed and not self.forced and self.exit_code == 0 and self.signal is None

    @property
    def failed(self) -> bool:
        """The command ran and exited non-zero or died of a signal."""
        return self.exit_code is not None and (self.exit_code != 0 or self.signal is not None)

    @property
    def outcome(self) -> str:
        if self.exit_code is None:
            return "refused"
        return f"killed by {self.signal}" if self.signal else f"exit {self.exit_code}"

    @property
    def gate(self) -> str:
        return "passed" if self.passed else ("forced" if self.forced else "refused")

    @property
    def exit_status(self) -> str | None:
        """The signal's name, else the exit code; None when the gate refused."""
        return self.signal or (None if self.exit_code is None else str(self.exit_code))

    @property
    def command_line(self) -> str:
        """The command as a table shows it: the program's base name, then its arguments."""
        return shlex.join([os.path.basename(self.argv[0]), *self.argv[1:]]) if self.argv else ""

    @property
    def snapshot_short(self) -> str:
        """The snapshot's first 12 hex digits (or of an old record's file name)."""
        return self.snapshot.removeprefix("sha256-")[:12]

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["argv"], data["findings"] = list(self.argv), list(self.findings)
        data["stderr_tail"] = list(self.stderr_tail)
        return {"schema": RUN_SCHEMA, **data}


TAIL_LINES = 20
"""Lines of the command's stderr a run record keeps."""
MAX_TAIL_LINE = 500
"""Characters kept of each of them."""


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def content_digest(snapshot: Snapshot) -> str:
    """``sha256-<hex>`` of the snapshot without what differs between two identical
    environments (when it was taken and how long that took)."""
    stable = dataclasses.replace(snapshot, created_at="", duration_s=0.0, timings_ms={})
    return "sha256-" + hashlib.sha256(stable.to_json().encode()).hexdigest()


def runs_dir(cwd: Path) -> Path:
    return cwd / RUNS_DIR


def snapshot_path(cwd: Path, ref: str) -> Path:
    """The file of a record's ``snapshot`` reference."""
    if _DIGEST.fullmatch(ref):
        return cwd / SNAPSHOT_BY_DIGEST_DIR / f"{ref}.json"
    return runs_dir(cwd) / os.path.basename(ref)


def store_snapshot(snapshot: Snapshot, cwd: Path) -> str:
    """Keep ``snapshot`` in the content-addressed store (once) and return its digest."""
    digest = content_digest(snapshot)
    path = snapshot_path(cwd, digest)
    check_state_path(path, cwd)  # a link there is refused, not taken for the stored file
    if not path.is_file():
        write_text_atomic(path, snapshot.to_json(), mode=0o600, state_root=cwd)
    return digest


def record_run(snapshot: Snapshot, *, cwd: Path, argv: Sequence[str], lock: str | None,
               lockfile: str | None, entry: str | None, started_at: str, ended_at: str,
               exit_code: int | None, signal: str | None, passed: bool, forced: bool,
               findings: Sequence[str], stderr_tail: Sequence[str] = ()) -> RunRecord:
    """Write the run's record (argv redacted) and its snapshot; move ``last-good`` to it
    when it succeeded."""
    digest = store_snapshot(snapshot, cwd)
    stamp = _id_stamp(started_at)
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", lock or "run")[:64]
    record = RunRecord(
        id=_unused_id(cwd, f"{stamp}-{name}"), argv=tuple(redact_argv(list(argv))), lock=lock,
        lockfile=lockfile, entry=entry, started_at=started_at, ended_at=ended_at,
        exit_code=exit_code, signal=signal, passed=passed, forced=forced,
        findings=tuple(findings), snapshot=digest,
        stderr_tail=tuple(redact_text(line) for line in stderr_tail[-TAIL_LINES:]))
    write_text_atomic(runs_dir(cwd) / f"{record.id}{RECORD_SUFFIX}",
                      json.dumps(record.to_dict(), indent=2, sort_keys=True) + "\n", mode=0o600,
                      state_root=cwd)
    if record.succeeded:
        current = last_good(cwd)
        if current is None or current.id <= record.id:
            pointer = {"schema": POINTER_SCHEMA, "run": record.id, "snapshot": digest,
                       "ended_at": ended_at}
            write_text_atomic(runs_dir(cwd) / LAST_GOOD,
                              json.dumps(pointer, indent=2, sort_keys=True) + "\n", mode=0o600,
                              state_root=cwd)
    return record


def _id_stamp(started_at: str) -> str:
    """A run id's time: when the run STARTED (as ``envguard runs`` sorts and shows it), in
    UTC to the microsecond; the time now for a start time that does not parse."""
    try:
        when = datetime.fromisoformat(started_at.replace("Z", "+00:00"))
    except ValueError:
        when = datetime.now(timezone.utc)
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return when.astimezone(timezone.utc).strftime("%Y%m%dT%H%M%S%fZ")


def _unused_id(cwd: Path, base: str) -> str:
    candidate, n = base, 1
    while (runs_dir(cwd) / f"{candidate}{RECORD_SUFFIX}").exists():
        n += 1
        candidate = f"{base}-{n}"
    return candidate


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


def parse_record(record_id: str, text: str) -> RunRecord:
    """A record from its JSON (``envguard.run/1`` or ``/2``); InputError when malformed."""
    try:
        data = json.loads(text)
    except ValueError:
        raise InputError(f"run record {record_id}: not valid JSON") from None
    if not isinstance(data, dict) or not str(data.get("schema", "")).startswith("envguard.run/"):
        raise InputError(f"run record {record_id}: not an envguard run record")
    argv, findings = data.get("argv", []), data.get("findings", [])
    tail = data.get("stderr_tail", [])
    tail = [str(x)[:MAX_TAIL_LINE] for x in tail[-TAIL_LINES:]] if isinstance(tail, list) else []
    code, snap = data.get("exit_code"), data.get("snapshot")
    if not (isinstance(argv, list) and isinstance(findings, list) and isinstance(snap, str)
            and (code is None or (isinstance(code, int) and not isinstance(code, bool)))):
        raise InputError(f"run record {record_id}: malformed")
    started = _text(data.get("started_at")) or ""
    # Redacted again: a record written by an older envguard or by hand keeps no secret.
    return redact_data(RunRecord(
        id=record_id, argv=tuple(redact_argv([str(a) for a in argv])), lock=_text(data.get("lock")),
        lockfile=_text(data.get("lockfile")), entry=_text(data.get("entry")),
        started_at=started, ended_at=_text(data.get("ended_at")) or started,
        exit_code=code, signal=_text(data.get("signal")), passed=data.get("passed") is True,
        forced=data.get("forced") is True, findings=tuple(str(f) for f in findings),
        snapshot=snap, stderr_tail=tuple(tail)))


def read_record(cwd: Path, record_id: str) -> RunRecord:
    path = runs_dir(cwd) / f"{os.path.basename(record_id)}{RECORD_SUFFIX}"
    return parse_record(record_id, read_input_text(path, what="run record",
                                                   limit=MAX_RECORD_BYTES, follow=False))


def list_runs(cwd: Path) -> list[RunRecord]:
    """Every readable run record, newest first (a malformed one is skipped)."""
    folder = runs_dir(cwd)
    if not folder.is_dir():
        return []
    ids = sorted((p.name[:-len(RECORD_SUFFIX)] for p in folder.iterdir()
                  if p.name.endswith(RECORD_SUFFIX)), reverse=True)
    out = []
    for record_id in ids:
        try:
            out.append(read_record(cwd, record_id))
        except InputError:
            continue
    return out


def last_good(cwd: Path) -> RunRecord | None:
    """The run ``last-good`` points at, or None (no pointer, or a stale one)."""
    path = runs_dir(cwd) / LAST_GOOD
    if not path.is_file():  # a link is refused by the read below: None too
        return None
    try:
        data = json.loads(read_input_text(path, what="last-good pointer",
                                          limit=MAX_RECORD_BYTES, follow=False))
    except (InputError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("schema") != POINTER_SCHEMA:
        return None
    run = data.get("run")
    if not isinstance(run, str):
        return None
    try:
        return read_record(cwd, run)
    except InputError:
        return None


def last_good_by_lock(cwd: Path) -> dict[str, RunRecord]:
    """Each lock's newest run that succeeded (:attr:`RunRecord.succeeded`), by lock name."""
    found: dict[str, RunRecord] = {}
    for record in list_runs(cwd):  # newest first
        if record.succeeded and record.lock and record.lock not in found:
            found[record.lock] = record
    return found


def last_good_of(cwd: Path, lock: str) -> RunRecord | None:
    """The newest run of ``lock`` that succeeded, or None."""
    return last_good_by_lock(cwd).get(lock)


@frozen
class Pruned:
    runs: tuple[str, ...]
    snapshots: tuple[str, ...]
    kept: int


def prune(cwd: Path, keep: int) -> Pruned:
    """Remove all but the ``keep`` newest run records (the ``last-good`` run, and each lock's
    last good run, are always kept), then every stored snapshot no remaining record refers
    to, and the temporaries a killed writer left in ``.envguard/``. A symlinked state folder
    or ``last-good.json`` is refused (OutputError) before anything is removed."""
    if keep < 0:
        raise InputError("--keep must be 0 or more")
    check_state_path(runs_dir(cwd) / LAST_GOOD, cwd)
    check_state_path(cwd / SNAPSHOT_BY_DIGEST_DIR / "sha256-.json", cwd)
    for folder in (PROJECT_DIR, RUNS_DIR, SNAPSHOT_DIR, SNAPSHOT_BY_DIGEST_DIR, FLEET_DIR):
        sweep_stale_temps(cwd / folder)
    records = list_runs(cwd)
    good = last_good(cwd)
    keep_ids = ({r.id for r in records[:keep]} | ({good.id} if good else set())
                | {r.id for r in last_good_by_lock(cwd).values()})
    removed = []
    for record in records:
        if record.id not in keep_ids:
            (runs_dir(cwd) / f"{record.id}{RECORD_SUFFIX}").unlink(missing_ok=True)
            if not _DIGEST.fullmatch(record.snapshot):  # an old record's own snapshot file
                snapshot_path(cwd, record.snapshot).unlink(missing_ok=True)
            removed.append(record.id)
    referenced = {r.snapshot for r in records if r.id in keep_ids}
    gone = []
    store = cwd / SNAPSHOT_BY_DIGEST_DIR
    if store.is_dir():
        for path in sorted(store.iterdir()):
            digest = path.name.removesuffix(".json")
            if _DIGEST.fullmatch(digest) and digest not in referenced:
                path.unlink(missing_ok=True)
                gone.append(digest)
    return Pruned(runs=tuple(removed), snapshots=tuple(gone), kept=len(keep_ids))


@frozen
class RunList:
    """``envguard runs``: the recorded runs, newest first, and which one is last-good."""

    runs: tuple[RunRecord, ...]
    last_good: str | None

    @property
    def last_good_run(self) -> RunRecord | None:
        return next((r for r in self.runs if r.id == self.last_good), None)

    def to_dict(self) -> dict[str, Any]:
        return {"schema": "envguard.runs/1", "last_good": self.last_good,
                "runs": [{**r.to_dict(), "succeeded": r.succeeded, "gate": r.gate,
                          "outcome": r.outcome} for r in self.runs]}


def run_list(cwd: Path) -> RunList:
    good = last_good(cwd)
    return RunList(runs=tuple(list_runs(cwd)), last_good=good.id if good else None)
