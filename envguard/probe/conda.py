"""Conda packages of a prefix: ``conda-meta/*.json``, and their files against
``paths_data``.

conda, mamba and pixi write one JSON record per package into ``PREFIX/conda-meta/``: name,
version, build, channel, the archive's md5/sha256, the spec that was asked for, and
``paths_data``, every file with its sha256 and size. That is how CUDA itself often
arrives in such environments (``cudatoolkit``, ``cuda-runtime``, ``cudnn``, ``nccl``,
``mkl``), invisible to anything that reads only Python metadata.

The file check follows what ``conda doctor`` tolerates: a file conda rewrote at link
time (``prefix_placeholder``, text or binary) cannot match its recorded size or hash and
is skipped, as are softlinks, folders and ``no_link`` entries.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envguard.input_file import RECORD_BYTES, NotReadable, read_bounded
from envguard.model import CondaPackage, Distribution, IntegrityIssue, ProbeIssue
from envguard.probe.integrity import hash_file, record_digest

PYTHON_NAMES = {"pytorch": "torch", "pytorch-cpu": "torch", "pytorch-gpu": "torch",
                "py-opencv": "opencv-python", "pyyaml": "pyyaml", "tensorflow-base": "tensorflow"}
"""Conda package names whose Python distribution is called otherwise."""
MAX_RECORD_BYTES = RECORD_BYTES
"""A conda-meta record larger than this (64 MiB) is not read (a real one is at most a few MB)."""


def _channel(record: dict[str, Any]) -> str | None:
    """``https://conda.anaconda.org/conda-forge/linux-64`` -> ``conda-forge``."""
    raw = record.get("channel") or record.get("schannel")
    if not isinstance(raw, str) or not raw:
        return None
    text = raw.rstrip("/")
    subdir = record.get("subdir")
    if isinstance(subdir, str) and text.endswith("/" + subdir):
        text = text[: -len(subdir) - 1]
    for host in ("https://conda.anaconda.org/", "http://conda.anaconda.org/",
                 "https://repo.anaconda.com/", "https://prefix.dev/"):
        if text.startswith(host):
            return text[len(host):]
    return text


def _paths(record: dict[str, Any]) -> list[dict[str, Any]]:
    data = record.get("paths_data")
    paths = data.get("paths") if isinstance(data, dict) else None
    return [p for p in paths if isinstance(p, dict) and isinstance(p.get("_path"), str)] \
        if isinstance(paths, list) else []


def _fingerprint(paths: list[dict[str, Any]]) -> str | None:
    if not paths:
        return None
    lines = sorted(f"{p['_path']},{p.get('sha256') or ''},{p.get('size_in_bytes') or ''}"
                   for p in paths)
    return "sha256:" + hashlib.sha256("\n".join(lines).encode("utf-8")).hexdigest()


def _text(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def _requested(record: dict[str, Any]) -> str | None:
    """conda's ``requested_spec``, or rattler's and pixi's ``requested_specs`` list."""
    specs = record.get("requested_specs")
    if isinstance(specs, list) and specs and all(isinstance(x, str) for x in specs):
        return ", ".join(specs)
    return _text(record.get("requested_spec"))


def read_records(prefix: Path, issues: list[ProbeIssue]) -> list[tuple[CondaPackage,
                                                                        list[dict[str, Any]]]]:
    """Every readable record of ``prefix/conda-meta`` with its ``paths_data`` entries;
    an unreadable or malformed one is an issue, never an error."""
    folder = prefix / "conda-meta"
    try:
        names = sorted(n for n in os.listdir(folder) if n.endswith(".json"))
    except OSError:
        return []
    out = []
    for name in names:
        path = folder / name
        try:  # bounded: a FIFO or /dev/zero planted here must not hang or exhaust us
            record = json.loads(read_bounded(path, what="conda record", limit=MAX_RECORD_BYTES))
        except FileNotFoundError:
            continue  # removed since the listing
        except (NotReadable, ValueError, RecursionError) as exc:
            why = exc.reason if isinstance(exc, NotReadable) else str(exc) or type(exc).__name__
            issues.append(ProbeIssue(section="conda", path=str(path),
                                     message=f"conda record not read: {why}"))
            continue
        if not isinstance(record, dict) or not _text(record.get("name")):
            issues.append(ProbeIssue(section="conda", path=str(path),
                                     message="conda record without a name"))
            continue
        paths = _paths(record)
        number = record.get("build_number")
        out.append((CondaPackage(
            name=str(record["name"]), version=str(record.get("version") or ""),
            build=str(record.get("build") or record.get("build_string") or ""),
            build_number=number if isinstance(number, int) else None,
            channel=_channel(record), subdir=_text(record.get("subdir")),
            md5=_text(record.get("md5")), sha256=_text(record.get("sha256")),
            requested_spec=_requested(record), url=_text(record.get("url")),
            fingerprint=_fingerprint(paths), files=len(paths)), paths))
    return out


def with_python_dists(packages: list[CondaPackage], dists: Iterable[Distribution]
                      ) -> list[CondaPackage]:
    """Mark conda packages that a pip or uv install of the same name sits on (conda's own
    Python packages have a dist-info too, with INSTALLER ``conda``: one package, not two)."""
    import dataclasses

    by_name = {d.name: d for d in dists}
    out = []
    for pkg in packages:
        python_name = PYTHON_NAMES.get(pkg.name, pkg.name.lower().replace("_", "-"))
        dist = by_name.get(python_name)
        other = dist.installer if dist is not None and dist.installer not in (None, "conda") \
            else None
        out.append(dataclasses.replace(pkg, pip_also=other) if other else pkg)
    return out


@dataclass(slots=True)
class CondaCheck:
    """What :func:`verify` checked, counted as the Python distributions' files are."""

    issues: list[IntegrityIssue] = field(default_factory=list)
    files: int = 0
    size: int = 0
    hashed: int = 0
    tolerated: int = 0
    """Files conda rewrites at link time (``prefix_placeholder``) and ``no_link`` entries."""


def verify(prefix: Path, records: list[tuple[CondaPackage, list[dict[str, Any]]]],
           mode: str) -> CondaCheck:
    """Missing and altered files against ``paths_data`` (``mode``: size or hash)."""
    out = CondaCheck()
    if mode == "none":
        return out
    root = str(prefix)
    issues = out.issues
    for pkg, paths in records:
        owner = f"conda:{pkg.name}"
        for entry in paths:
            rel = entry["_path"]
            if entry.get("path_type", "hardlink") not in ("hardlink", "file"):
                continue  # softlinks and folders
            if entry.get("no_link") or entry.get("prefix_placeholder"):
                out.tolerated += 1  # files conda rewrites at link time, or copies
                continue
            full = os.path.normpath(os.path.join(root, rel))
            if not full.startswith(root + os.sep):
                continue
            try:
                st = os.stat(full)
            except FileNotFoundError:
                issues.append(IntegrityIssue(package=owner, path=rel, problem="missing"))
                continue
            except OSError:
                continue
            if not stat.S_ISREG(st.st_mode):
                continue
            out.files += 1
            out.size += st.st_size
            size = entry.get("size_in_bytes")
            if isinstance(size, int) and size != st.st_size:
                issues.append(IntegrityIssue(package=owner, path=rel, problem="size",
                                             expected=str(size), actual=str(st.st_size)))
            elif mode == "hash" and isinstance(entry.get("sha256"), str):
                try:  # the RECORD hasher: regular files only, checked on the descriptor
                    digest = hash_file(full, "sha256")
                    expected = record_digest(bytes.fromhex(entry["sha256"]))
                except (OSError, ValueError):
                    continue
                out.hashed += st.st_size
                if digest != expected:
                    issues.append(IntegrityIssue(package=owner, path=rel, problem="hash",
                                                 expected=expected, actual=digest))
    return out
