"""envguard: record the environment a training run worked in, and explain what changed.

The public Python API is :mod:`envguard.api`, re-exported here (``envguard.snapshot()``,
``envguard.diff()``, ...; docs/API.md). The rest of the package is internal.

The package is layered collect -> analyse -> render, as pip-audit is; each layer imports
only the layers below it:

* :mod:`envguard.cli` (top): one module per command; the only code that prints or exits;
* :mod:`envguard.render`: pure functions from reports to text; :func:`envguard.render.render`
  is the one place an output format is chosen;
* the commands' cores: :mod:`envguard.gate` (lockfiles, check, run), :mod:`envguard.restore`,
  :mod:`envguard.cache` (compile-cache archives), :mod:`envguard.fleet`;
* :mod:`envguard.explain` (rules that explain a diff) and :mod:`envguard.changes` (what
  differs between two snapshots);
* :mod:`envguard.probe` collects facts about an interpreter's environment without
  importing torch; its memo files and stat-ahead live in :mod:`envguard.probe.fastpath`;
* the ground: :mod:`envguard.model` (the snapshot as frozen dataclasses),
  :mod:`envguard.snapshot_file`, :mod:`envguard.validation`, :mod:`envguard.errors` (the one
  exception tree), :mod:`envguard.exitcodes`, :mod:`envguard.paths` (envguard's own folders),
  :mod:`envguard.atomic`, :mod:`envguard.toml_write`, :mod:`envguard.units`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from envguard.version import __version__

if TYPE_CHECKING:
    from envguard.api import (
        BisectReport,
        DoctorReport,
        GateResult,
        InstallPlan,
        Report,
        Snapshot,
        UndoReport,
        bisect,
        check,
        diagnose,
        diff,
        format_report,
        plan_install,
        read_snapshot,
        snapshot,
        undo,
    )

__all__ = ["BisectReport", "DoctorReport", "GateResult", "InstallPlan", "Report", "Snapshot",
           "UndoReport", "__version__", "bisect", "check", "diagnose", "diff", "format_report",
           "plan_install", "read_snapshot", "snapshot", "undo"]

_API = frozenset(__all__) - {"__version__"}


def __getattr__(name: str) -> Any:
    """The public API (:mod:`envguard.api`), loaded on first use: the command line, which
    imports this package first, never pays for it."""
    if name in _API:
        from envguard import api

        return getattr(api, name)
    raise AttributeError(f"module 'envguard' has no attribute {name!r}")
