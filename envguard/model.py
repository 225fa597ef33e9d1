"""The snapshot document: frozen dataclasses, a deterministic JSON form, and validation.

Every section is plain data. ``Snapshot.to_json()`` sorts keys, so two snapshots of
one environment differ only where the environment (or the clock) does.
``Snapshot.from_json()`` validates types field by field and names the offending
path, as packaging's ``pylock`` does: ``expected str, got int in 'packages[3].version'``.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import field
from pathlib import Path
from typing import Any

from envguard.errors import SnapshotValidationError, UnsupportedSchemaError
from envguard.frozen import frozen
from envguard.validation import build, parse_json, to_plain, type_name

SCHEMA_NAME = "envguard.snapshot"
SCHEMA_MAJOR = 1
SCHEMA_MINOR = 0
SCHEMA = f"{SCHEMA_NAME}/{SCHEMA_MAJOR}"

_SCHEMA_RE = re.compile(rf"{re.escape(SCHEMA_NAME)}/([0-9]+)(?:\.([0-9]+))?")


@frozen
class ProbeIssue:
    """A probe that failed or timed out; the snapshot still completes."""

    section: str
    message: str
    path: str | None = None


@frozen
class Interpreter:
    executable: str
    version: str
    implementation: str
    prefix: str
    base_prefix: str
    is_venv: bool
    site_packages: list[str]
    sys_path: list[str]
    interpreter_tag: str
    abi_tag: str | None
    platform: str
    best_tag: str | None = None
    """The most specific wheel tag it installs (``cp311-cp311-manylinux_2_36_x86_64``)."""
    selected_by: str | None = None
    """Why envguard looked at this environment: ``--python``, ``ENVGUARD_PYTHON``,
    ``VIRTUAL_ENV``, ``CONDA_PREFIX``, ``.venv``, ... (docs/CLI.md, "Which environment");
    None in older snapshots. Never compared by diff."""


@frozen
class DirectUrl:
    """PEP 610 ``direct_url.json``: how a distribution was installed from a URL or folder."""

    url: str
    editable: bool = False
    vcs: str | None = None
    commit_id: str | None = None
    requested_revision: str | None = None
    archive_hash: str | None = None
    subdirectory: str | None = None


@frozen
class Distribution:
    name: str
    """Normalized (PEP 503) project name."""
    version: str | None
    location: str
    """The sys.path folder that holds the metadata."""
    metadata_dir: str
    installer: str | None = None
    requested: bool = False
    editable: bool = False
    direct_url: DirectUrl | None = None
    fingerprint: str | None = None
    """sha256 over the normalized RECORD; equal for pip and uv installs of one wheel."""
    record_entries: int = 0
    wheel_generator: str | None = None
    wheel_tags: list[str] = field(default_factory=list)
    wheel_build: str | None = None
    requires: list[str] = field(default_factory=list)
    shadowed: list[str] = field(default_factory=list)
    """Other sys.path folders that also hold this name (the first one wins)."""
    stated: dict[str, str] = field(default_factory=dict)
    """Constants it states about itself in its own version file (torchvision's ``cuda``,
    jax's ``_minimum_jaxlib_version``: :mod:`envguard.probe.stated`), read with ``ast``."""
    top_level: list[str] = field(default_factory=list)
    """The modules it installs, read from RECORD: each top-level package or module, and
    for a namespace package (a folder without ``__init__.py``: ``google``) its packages
    (``google.protobuf``). What maps an error's module to its distribution."""


@frozen
class CondaPackage:
    """One record of ``conda-meta/*.json`` (a conda, mamba or pixi install)."""

    name: str
    version: str
    build: str = ""
    build_number: int | None = None
    channel: str | None = None
    """``conda-forge``, ``pytorch``, ``pkgs/main``, ... (the channel URL's path)."""
    subdir: str | None = None
    md5: str | None = None
    sha256: str | None = None
    requested_spec: str | None = None
    url: str | None = None
    """The package archive it was installed from (what an ``@EXPLICIT`` spec lists)."""
    fingerprint: str | None = None
    """sha256 over its ``paths_data`` (path, sha256, size), as a dist's RECORD fingerprint."""
    files: int = 0
    pip_also: str | None = None
    """The installer of a Python dist-info of the same name that is not conda's own
    (``pip``, ``uv``): the package was installed over by another installer."""


@frozen
class TorchIdentity:
    present: bool
    location: str | None = None
    version: str | None = None
    git_version: str | None = None
    cuda: str | None = None
    hip: str | None = None
    debug: bool | None = None
    version_fields: dict[str, str | bool | None] = field(default_factory=dict)
    """Every simple assignment in ``torch/version.py``, whatever fields this build has."""
    dist_version: str | None = None
    """The version in torch's METADATA; PyPI builds drop the ``+cuXXX`` label here."""
    triton_version: str | None = None
    triton_fingerprint: str | None = None
    cuda_wheel_family: str | None = None
    """``cu12`` (nvidia-*-cu12), ``cu13`` (cuda-toolkit, unsuffixed nvidia-*), ``mixed``."""
    cuda_wheels: list[str] = field(default_factory=list)
    compat_key: str | None = None
    """Import-free stand-in for torch's compile-cache keys: torch sources, triton, CUDA, GPU."""


@frozen
class IntegrityIssue:
    package: str
    path: str
    problem: str
    """``missing``, ``size``, ``hash``, ``unreadable``, ``modified-after-install``,
    ``not-a-regular-file`` (``actual``: FIFO, character device, folder, ...; never read) or
    ``outside-install-tree`` (``actual``: where the RECORD path leads; never opened)."""
    expected: str | None = None
    actual: str | None = None
    links: int | None = None
    """Hard links to a file that differs, when more than one: uv links from its cache, so
    the edit is in the cache's copy and in every venv linked to it. None: one, or unknown."""
    shared_with: str | None = None
    """The other link found in uv's cache: its ``archive-v0/ID`` folder."""


@frozen
class Integrity:
    mode: str
    """``none``, ``size`` or ``hash``."""
    checked_files: int = 0
    checked_bytes: int = 0
    hashed_bytes: int = 0
    """Bytes actually read; the rest came from the hash cache."""
    tolerated: int = 0
    """RECORD quirks skipped on purpose: rewritten scripts, unhashed entries."""
    issues: list[IntegrityIssue] = field(default_factory=list)
    without_record: list[str] = field(default_factory=list)
    checked_by_folder: int = 0
    """Size mode: header files (under a folder named ``include``) vouched for by their
    folder, unchanged since the install, instead of one ``stat`` each; not in
    ``checked_files``."""


@frozen
class BuildStamp:
    """The build a compile cache was seen populated under (envguard's own marker)."""

    compat_key: str
    torch_version: str | None = None
    torch_git_version: str | None = None
    triton_version: str | None = None
    first_seen: str | None = None


@frozen
class CacheDir:
    kind: str
    """``inductor``, ``triton`` or ``cuda``."""
    path: str
    source: str
    """The variable the location came from, or ``default``."""
    exists: bool
    total_bytes: int = 0
    files: int = 0
    entries: dict[str, int] = field(default_factory=dict)
    """Files per top-level subfolder (fxgraph, aotautograd, triton, ...)."""
    newest_mtime: float | None = None
    filesystem: str | None = None
    truncated: bool = False
    populated_under: list[BuildStamp] = field(default_factory=list)
    """Builds recorded by earlier snapshots in this cache; empty when unknown."""
    marker: str = "none"
    """``none``, ``created``, ``seen`` (current build already recorded) or ``added``."""


@frozen
class TrackedFile:
    pattern: str
    path: str
    exists: bool
    size: int | None = None
    md5: str | None = None
    sha256: str | None = None


@frozen
class GitState:
    root: str
    commit: str | None
    branch: str | None
    dirty: list[str] = field(default_factory=list)
    untracked: int = 0


@frozen
class Files:
    files: list[TrackedFile] = field(default_factory=list)
    git: GitState | None = None


@frozen
class Gpu:
    index: int
    name: str
    memory_mib: int | None = None
    compute_capability: str | None = None


@frozen
class System:
    os: str
    kernel: str
    machine: str
    hostname: str
    glibc: str | None = None
    cpu_model: str | None = None
    cpu_logical: int | None = None
    cpu_physical: int | None = None
    memory_bytes: int | None = None
    gpu_probe: str = "absent"
    """``ok``, ``absent`` (no nvidia-smi) or ``error``."""
    gpus: list[Gpu] = field(default_factory=list)
    driver_version: str | None = None
    cuda_driver_version: str | None = None
    nvcc: str | None = None
    cuda_home: str | None = None


@frozen
class EnvValue:
    value: str | None
    """The value, or None when masked."""
    masked: bool = False
    digest: str | None = None
    """Keyed HMAC of a masked value: detects a change without revealing the value."""


@frozen
class Environment:
    variables: dict[str, EnvValue] = field(default_factory=dict)
    mask_key_id: str | None = None
    """Which key masked the digests; digests compare only under the same key."""


@frozen
class Deep:
    """Facts that need ``import torch``, gathered in a crash-isolated subprocess (--deep)."""

    ok: bool
    error: str | None = None
    torch_version: str | None = None
    cuda_available: bool | None = None
    device_count: int | None = None
    device_capability: list[str] = field(default_factory=list)
    cudnn_version: str | None = None
    nccl_version: str | None = None
    config: str | None = None
    torch_key: str | None = None
    """torch's own ``torch_key()``: the hash inductor puts in every cache key."""
    seconds: float | None = None


@frozen
class Options:
    verify: str
    deep: bool
    python: str | None
    file_patterns: list[str] = field(default_factory=list)


@frozen
class Snapshot:
    schema: str
    envguard_version: str
    created_at: str
    duration_s: float
    options: Options
    interpreter: Interpreter
    torch: TorchIdentity
    packages: list[Distribution]
    integrity: Integrity
    caches: list[CacheDir]
    files: Files
    system: System
    environment: Environment
    deep: Deep | None = None
    conda: list[CondaPackage] = field(default_factory=list)
    """Every conda package of the prefix (empty outside conda and pixi environments)."""
    errors: list[ProbeIssue] = field(default_factory=list)
    timings_ms: dict[str, float] = field(default_factory=dict)
    """Where the snapshot's time went, per phase; never compared by diff."""

    def package(self, name: str) -> Distribution | None:
        """The distribution called ``name`` (normalized), if installed."""
        for dist in self.packages:
            if dist.name == name:
                return dist
        return None

    def to_dict(self) -> dict[str, Any]:
        """The JSON-ready form (what ``dataclasses.asdict`` gives, three times faster)."""
        document: dict[str, Any] = to_plain(self)
        return document

    def write(self, path: str | os.PathLike[str]) -> Path:
        """Write :meth:`to_json` to ``path`` atomically (through a symlink, keeping an
        existing file's mode; :mod:`envguard.atomic`) and return the path written."""
        from envguard.atomic import write_text_atomic

        return write_text_atomic(path, self.to_json())

    @property
    def sha256(self) -> str:
        """``sha256:<hex>`` of :meth:`to_json`: what ``sha256sum`` prints for a file
        :meth:`write` wrote (and what ``envguard run`` passes in ``ENVGUARD_VERIFIED``)."""
        return "sha256:" + hashlib.sha256(self.to_json().encode()).hexdigest()

    def to_json(self) -> str:
        """Deterministic JSON: sorted keys, two-space indent, trailing newline."""
        return json.dumps(self.to_dict(), sort_keys=True, indent=2, ensure_ascii=True) + "\n"

    @classmethod
    def from_dict(cls, data: object) -> Snapshot:
        if not isinstance(data, dict):
            raise SnapshotValidationError(f"expected an object, got {type_name(data)}")
        check_schema(data.get("schema"))
        return build(cls, data)

    @classmethod
    def from_json(cls, text: str) -> Snapshot:
        return cls.from_dict(parse_json(text))

    def validate(self) -> Snapshot:
        """Round trip through the dict form; raises if any field has the wrong type."""
        return Snapshot.from_dict(json.loads(self.to_json()))


def check_schema(value: object) -> tuple[int, int]:
    """Parse a schema string; a newer major is an error, a newer minor is accepted."""
    if not isinstance(value, str):
        raise SnapshotValidationError(f"missing or invalid schema (expected '{SCHEMA}')",
                                      context="schema")
    match = _SCHEMA_RE.fullmatch(value)
    if match is None:
        raise SnapshotValidationError(f"not an envguard snapshot (schema {value!r})",
                                      context="schema")
    major, minor = _schema_int(match.group(1)), _schema_int(match.group(2) or "0")
    if major > SCHEMA_MAJOR:
        raise UnsupportedSchemaError(f"snapshot schema {value} is newer than this envguard "
                                     f"reads ({SCHEMA}); upgrade envguard")
    if major < 1:
        raise SnapshotValidationError(f"unknown schema version {value!r}", context="schema")
    return major, minor


def _schema_int(digits: str) -> int:
    """A schema version number; absurdly long ones (int() refuses > 4300 digits) saturate."""
    digits = digits.lstrip("0") or "0"
    return int(digits) if len(digits) <= 9 else 10**9
