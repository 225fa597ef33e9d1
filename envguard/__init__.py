"""envguard: record the environment a training run worked in, and explain what changed.

The package is layered collect -> analyse -> render, as pip-audit is; each layer imports
only the layers below it:

* :mod:`envguard.cli` (top): one module per command; the only code that prints or exits;
* :mod:`envguard.render`: pure functions from reports to text; :func:`envguard.render.render`
  is the one place an output format is chosen;
* the commands' cores: :mod:`envguard.gate` (lockfiles, check, run), :mod:`envguard.restore`,
  :mod:`envguard.cache` (compile-cache archives), :mod:`envguard.fleet`;
* :mod:`envguard.explain` (rules that explain a diff) and :mod:`envguard.diff`;
* :mod:`envguard.probe` collects facts about an interpreter's environment without
  importing torch; its memo files live in :mod:`envguard.probe.memo`;
* the ground: :mod:`envguard.model` (the snapshot as frozen dataclasses),
  :mod:`envguard.snapshot_file`, :mod:`envguard.validation`, :mod:`envguard.errors` (the one
  exception tree), :mod:`envguard.exitcodes`, :mod:`envguard.paths` (envguard's own folders),
  :mod:`envguard.atomic`, :mod:`envguard.toml_write`, :mod:`envguard.units`.
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
