"""RECORD files: the row, parsing, which rows identify a build, and the build fingerprint.

Light (the standard library and the bounded reader), so that the records memo
(:mod:`envguard.probe.fastpath.records`) can parse a RECORD again before the rest of envguard
is imported.
"""

from __future__ import annotations

import hashlib
import re

from envguard.input_file import RECORD_BYTES, NotReadable, read_bounded_text

RecordRow = tuple[str, str, str]
"""(path, ``algorithm=urlsafe-b64-digest``, size) as written in RECORD; empty strings allowed.
"""

_DROPPED_DIST_INFO_FILES = frozenset(
    {"INSTALLER", "REQUESTED", "RECORD", "direct_url.json", "uv_cache.json"}
)
_SCRIPT_DIRS = frozenset({"bin", "Scripts"})


def is_script_row(path: str) -> bool:
    """A RECORD path outside site-packages in a scripts folder (``../../../bin/x``).

    Installers rewrite these files' shebangs per environment, so their hashes differ
    between pip and uv and between venvs of the same wheel.
    """
    if not path.startswith(".."):
        return False
    parts = [p for p in re.split(r"[\\/]", path) if p not in ("..", ".", "")]
    return bool(parts) and parts[0] in _SCRIPT_DIRS


def is_fingerprinted(path: str) -> bool:
    """Whether a RECORD path takes part in the build fingerprint (and integrity checks)."""
    if "__pycache__" in path or path.endswith((".pyc", ".pyo")):
        return False  # also ../../../../prefix/...pyc: pip under PYTHONPYCACHEPREFIX
    if path.startswith(".."):
        return not is_script_row(path)
    if "-info/" in path or "-info\\" in path:
        head, _, base = path.replace("\\", "/").rpartition("/")
        return not (head.endswith((".dist-info", ".egg-info")) and base in _DROPPED_DIST_INFO_FILES)
    return True


def parse_record(text: str) -> list[RecordRow]:
    """RECORD rows (``path,sha256=...,size``); tolerates CRLF and short rows.

    Rows without quotes (nearly all) are split directly, three times faster than
    ``csv``; a quoted path (one holding a comma) goes through ``csv``.
    """
    rows: list[RecordRow] = []
    append = rows.append
    for line in text.replace("\r", "").split("\n"):
        if not line:
            continue
        if '"' in line:
            import csv  # only for a quoted path: not before the stat work starts

            parsed = next(csv.reader([line]), [])
            if not parsed or not parsed[0]:
                continue
            parsed += ["", ""]
            append((parsed[0], parsed[1], parsed[2]))
            continue
        parts = line.split(",")
        if len(parts) >= 3:
            if parts[0]:
                append((parts[0], parts[1], parts[2]))
        elif parts[0]:
            append((parts[0], parts[1] if len(parts) > 1 else "", ""))
    return rows


def record_rows(record_path: str) -> list[RecordRow]:
    """Every row of the RECORD at ``record_path``; FileNotFoundError if it is not there,
    :class:`~envguard.input_file.NotReadable` if it is not a regular file of at most
    :data:`~envguard.input_file.RECORD_BYTES`."""
    return parse_record(read_bounded_text(record_path, limit=RECORD_BYTES, what="RECORD"))


def read_record(record_path: str) -> tuple[int, list[RecordRow]]:
    """(rows in the RECORD at ``record_path``, the rows :func:`is_fingerprinted` keeps);
    raises as :func:`record_rows`."""
    rows = record_rows(record_path)
    return len(rows), [r for r in rows if is_fingerprinted(r[0])]


def fingerprinted_rows(record_path: str) -> list[RecordRow]:
    """The rows of :func:`read_record` that count; none if it cannot be read."""
    try:
        return read_record(record_path)[1]
    except (OSError, NotReadable):
        return []


def fingerprint_record(rows: list[RecordRow]) -> str:
    """sha256 over the sorted ``path,hash,size`` lines of already-filtered ``rows``.

    Dropped: scripts (shebangs are rewritten per venv), ``__pycache__``/``.pyc``,
    and INSTALLER, REQUESTED, RECORD, direct_url.json and uv_cache.json, which
    say *how* it was installed rather than *what*. pip and uv installs of one
    wheel give the same value; two builds of one version do not.
    """
    lines = sorted(",".join(r) for r in rows)
    return "sha256:" + hashlib.sha256("\n".join(lines).encode("utf-8")).hexdigest()


_MODULE_FILE = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)(?:\.py|(?:\.[\w-]+)?\.(?:so|pyd))$")
_SKIPPED_TOPS = (".dist-info", ".data", ".egg-info")


def top_level_modules(paths: list[str]) -> list[str]:
    """The modules a distribution installs, from its RECORD paths: each top-level module
    file (``six.py``, ``_cffi_backend.cpython-311-x86_64-linux-gnu.so``) and package folder
    (``numpy``), and for a folder without ``__init__.py`` (a namespace package: ``google``)
    its packages and modules instead (``google.protobuf``). Sorted, once each."""
    found: set[str] = set()
    folders: dict[str, set[str]] = {}
    packages: set[str] = set()
    for path in paths:
        first, _, rest = path.replace("\\", "/").partition("/")
        if not rest:
            module = _MODULE_FILE.match(first)
            if module:
                found.add(module.group(1))
            continue
        if (first.startswith("..") or first.endswith(_SKIPPED_TOPS) or first == "__pycache__"
                or not first.isidentifier()):
            continue
        below = folders.setdefault(first, set())
        second, _, deeper = rest.partition("/")
        if not deeper:
            if second.startswith("__init__."):
                packages.add(first)
            module = _MODULE_FILE.match(second)
            if module and module.group(1) != "__init__":
                below.add(module.group(1))
        elif (second.isidentifier() and second != "__pycache__"
              and deeper.endswith((".py", ".so", ".pyd"))):
            below.add(second)
    for folder, below in folders.items():
        if folder in packages:
            found.add(folder)
        else:
            found.update(f"{folder}.{name}" for name in below)
    return sorted(found)
