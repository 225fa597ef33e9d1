"""envguard: record the environment a training run worked in, and explain what changed.

The package is layered collect -> analyse -> render, as pip-audit is:

* :mod:`envguard.probe` collects facts about an interpreter's environment without
  importing torch;
* :mod:`envguard.model` holds the snapshot as frozen dataclasses and validates files;
* :mod:`envguard.render` turns plain data into text;
* :mod:`envguard.cli` is the only module that prints or exits.
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
