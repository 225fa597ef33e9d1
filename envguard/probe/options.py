"""What a snapshot probes: :class:`SnapshotOptions`, and the option sets commands share."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import field
from pathlib import Path

from envguard.frozen import frozen


@frozen(slots=False)
class SnapshotOptions:
    python: str | None = None
    """Another interpreter (or venv folder) to snapshot; None for envguard's own."""
    selected_by: str | None = None
    """Why this environment (``VIRTUAL_ENV``, ``--python``, ...: :mod:`envguard.probe.discovery`);
    recorded as ``interpreter.selected_by``. None: not chosen by the discovery rule."""
    verify: str = "size"
    deep: bool = False
    file_patterns: tuple[str, ...] = ()
    cwd: Path = field(default_factory=Path.cwd)
    use_project_config: bool = True
    """Read ``[tool.envguard]`` from the nearest pyproject.toml: its ``env`` patterns, and
    its ``files`` unless :attr:`project_files` is false."""
    project_files: bool = True
    """Hash ``[tool.envguard] files`` too (the gate does not: a lock records the files it
    pins, ``[tool.envguard] files`` among them, when it is made)."""
    remember_caches: bool = True
    """Note in envguard's own state which build saw each non-empty compile cache
    (:mod:`envguard.probe.sightings`); ``envguard cache status`` calls it ``seen``."""
    env: Mapping[str, str] | None = None
    memo_root: Path | None = None
    """Folder of envguard's memo files (hashes, parsed RECORDs, GPU facts); None: the
    default, :func:`envguard.paths.memo_dir`."""
    use_memo: bool = True
    """Reuse parsed RECORDs from earlier snapshots of the same environment."""
    memo_of: str | None = None
    """The environment (its prefix) this one is a scratch copy of: its memo of parsed
    dist-info folders is read, never written, through this one's paths
    (:class:`~envguard.probe.fastpath.records.BorrowedMemo`). With ``use_memo`` off."""
    integrity_only: frozenset[str] | None = None
    """Check only these distributions against RECORD (the gate's fast path); None: all."""
    git: bool = True
    """Record the git state of the working directory (the gate does not need it)."""


def locations_only(python: str | None) -> SnapshotOptions:
    """The build and the cache locations only: no integrity check, no git, no project
    config, no sighting remembered (``envguard cache`` and ``envguard restore``)."""
    return SnapshotOptions(python=python, verify="none", use_project_config=False,
                           remember_caches=False, git=False)
