"""Explain a diff: run every rule, rank the findings, re-rank by a pasted symptom.

Rules are listed explicitly in ``ALL_RULES`` (no registry). Their ids are a public
contract (docs/DIFF.md).

This face of the package loads nothing: its names come from their modules on first use
(:mod:`envguard.explain.engine` runs the rules), so that importing
:mod:`envguard.explain.tables` or :mod:`envguard.explain.remedies` does not load every rule
(the gate in front of a launch reads the lock's tables and loads a rule only to explain a
mismatch).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from envguard.explain.engine import ALL_RULES, explain, matches_symptom, symptom_score
    from envguard.explain.interface import Finding, Rule, Severity
    from envguard.explain.symptoms import symptom_text

__all__ = ["ALL_RULES", "Finding", "Rule", "Severity", "explain", "matches_symptom",
           "symptom_score", "symptom_text"]

_HOME = {"ALL_RULES": "engine", "explain": "engine", "matches_symptom": "engine",
         "symptom_score": "engine", "Finding": "interface", "Rule": "interface",
         "Severity": "interface", "symptom_text": "symptoms"}


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
    globals()[name] = value
    return value
