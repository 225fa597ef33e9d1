"""Reading snapshot files (and other JSON documents), with one-line errors that name the file."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from pathlib import Path

from envguard.errors import InputError, SnapshotValidationError, UnsupportedSchemaError
from envguard.input_file import MAX_INPUT_BYTES, read_input_text
from envguard.model import Integrity, IntegrityIssue, Snapshot, check_schema
from envguard.redact import redact_data, redact_snapshot, remask_environment
from envguard.validation import build, parse_json, type_name

MAX_SNAPSHOT_BYTES = MAX_INPUT_BYTES


def read_document(path: Path, *, limit: int = MAX_SNAPSHOT_BYTES, follow: bool = True) -> str:
    """The text of a snapshot-like file; InputError (exit 2) naming it when it is a folder,
    not a regular file (a FIFO, a device), larger than ``limit`` bytes, missing, unreadable
    or not UTF-8 (:func:`envguard.input_file.read_input`)."""
    return read_input_text(path, what="snapshot", limit=limit, follow=follow)


@contextlib.contextmanager
def naming(name: str) -> Iterator[None]:
    """Schema and validation errors of a document read from ``name``, as one-line errors
    that name it (a newer schema stays an UnsupportedSchemaError)."""
    try:
        yield
    except UnsupportedSchemaError as exc:
        raise UnsupportedSchemaError(f"{name}: {exc}") from None
    except SnapshotValidationError as exc:
        raise InputError(f"{name}: {exc}") from None
    except RecursionError:
        raise InputError(f"{name}: not a snapshot (nested too deeply)") from None


def read_snapshot(path: str | Path, *, follow: bool = True) -> Snapshot:
    """Load and validate a snapshot; InputError (exit 2) naming the file on any problem.
    ``follow=False`` for envguard's own state (a recorded run's snapshot, a lock's
    snapshots): a symlink there is refused, never read.

    Credentials in it (a file written before envguard redacted them) are masked here, so
    that nothing built from it (a lock, a restore, a report) carries them on."""
    text = read_document(Path(path), follow=follow)
    with naming(str(path)):
        return remask(Snapshot.from_json(text))


def remask(snapshot: Snapshot) -> Snapshot:
    """``snapshot`` as read from anywhere (a file, stdin, a fleet document) made what
    envguard writes today: every string redacted (dict keys too), and every variable that
    arrives unmasked although its name or value is secret masked.

    Such a variable's digest is the HMAC under this user's mask key when the file was
    made under that key or under none (then the file takes this key's id, unless it has
    digests of its own): its changes compare with this user's snapshots and with other
    files read here. A file made under another key gets no digest for it (none could
    compare with that file's own); :func:`envguard.changes.diff` then compares the
    visible (redacted) values only."""
    env = snapshot.environment
    local: list[tuple[bytes, str]] = []

    def digest(name: str, value: str) -> str | None:
        from envguard.probe.envvars import _digest, key_id, load_mask_key

        if not local:
            key = load_mask_key([])
            local.append((key, key_id(key)))
        key, ident = local[0]
        if env.mask_key_id not in (None, ident):
            return None
        return _digest(key, name, value)

    remasked = remask_environment(env, digest)
    if remasked is not env:
        snapshot = dataclasses.replace(snapshot, environment=remasked)
    out = redact_snapshot(snapshot)
    if local and env.mask_key_id is None \
            and not any(v.digest for v in env.variables.values()):
        out = dataclasses.replace(out, environment=dataclasses.replace(
            out.environment, mask_key_id=local[0][1]))
    return out


def read_integrity_issues(path: str | Path) -> list[IntegrityIssue]:
    """The ``integrity.issues`` of a snapshot file, and nothing else of it: what the gate
    reads of a lock entry's reference snapshot at every launch (the differences from RECORD
    accepted when the entry was locked). The schema and that section are validated and
    redacted as :func:`read_snapshot` does; the rest is parsed only (the whole file read
    that way took 70 ms of a gate on the H200 host, for a list that is usually short).
    InputError naming the file on any problem."""
    text = read_document(Path(path))
    with naming(str(path)):
        data = parse_json(text)
        if not isinstance(data, dict):
            raise SnapshotValidationError(f"expected an object, got {type_name(data)}")
        check_schema(data.get("schema"))
        section = build(Integrity, data.get("integrity"), "integrity")
        return redact_data(section.issues)
