"""Reading snapshot files, with one-line errors that name the file."""

from __future__ import annotations

from pathlib import Path

from envguard.errors import InputError, SnapshotValidationError, UnsupportedSchemaError
from envguard.model import Snapshot

MAX_SNAPSHOT_BYTES = 256 << 20


def read_snapshot(path: str | Path) -> Snapshot:
    """Load and validate a snapshot; InputError (exit 2) naming the file on any problem."""
    name = str(path)
    p = Path(path)
    try:
        if p.is_dir():
            raise InputError(f"{name}: is a folder, not a snapshot file")
        if p.stat().st_size > MAX_SNAPSHOT_BYTES:
            raise InputError(f"{name}: too large for a snapshot ({p.stat().st_size:,} bytes)")
        raw = p.read_bytes()
    except FileNotFoundError:
        raise InputError(f"{name}: no such file") from None
    except OSError as exc:
        raise InputError(f"{name}: cannot read: {exc.strerror or exc}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise InputError(f"{name}: not a snapshot (not UTF-8 text)") from None
    try:
        return Snapshot.from_json(text)
    except UnsupportedSchemaError as exc:
        raise UnsupportedSchemaError(f"{name}: {exc}") from None
    except SnapshotValidationError as exc:
        raise InputError(f"{name}: {exc}") from None
    except RecursionError:
        raise InputError(f"{name}: not a snapshot (nested too deeply)") from None
