"""Reading snapshot files (and other JSON documents), with one-line errors that name the file."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from envguard.errors import InputError, SnapshotValidationError, UnsupportedSchemaError
from envguard.input_file import MAX_INPUT_BYTES, read_input_text
from envguard.model import Integrity, IntegrityIssue, Snapshot, check_schema
from envguard.redact import redact_data, redact_snapshot
from envguard.validation import build, parse_json, type_name

MAX_SNAPSHOT_BYTES = MAX_INPUT_BYTES


def read_document(path: Path, *, limit: int = MAX_SNAPSHOT_BYTES) -> str:
    """The text of a snapshot-like file; InputError (exit 2) naming it when it is a folder,
    not a regular file (a FIFO, a device), larger than ``limit`` bytes, missing, unreadable
    or not UTF-8 (:func:`envguard.input_file.read_input`)."""
    return read_input_text(path, what="snapshot", limit=limit)


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


def read_snapshot(path: str | Path) -> Snapshot:
    """Load and validate a snapshot; InputError (exit 2) naming the file on any problem.

    Credentials in it (a file written before envguard redacted them) are masked here, so
    that nothing built from it (a lock, a restore, a report) carries them on."""
    text = read_document(Path(path))
    with naming(str(path)):
        return redact_snapshot(Snapshot.from_json(text))


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
