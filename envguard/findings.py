"""Findings: what a rule, the doctor or the gate says about an environment, as plain data.

The ground layer below :mod:`envguard.explain` (which makes them from a diff), the gate,
the doctor and the renderers, so that holding a finding imports no rule.
"""

from __future__ import annotations

from enum import Enum

from envguard.changes import Change
from envguard.frozen import frozen

__all__ = ["Finding", "Severity"]


class Severity(str, Enum):
    CRITICAL = "critical"
    WARNING = "warning"
    INFO = "info"

    @property
    def rank(self) -> int:
        return {"critical": 0, "warning": 1, "info": 2}[self.value]


@frozen
class Finding:
    rule: str
    severity: Severity
    title: str
    """One line: what changed."""
    explanation: str
    """Why this can cause a regression."""
    evidence: tuple[str, ...]
    remedy: tuple[str, ...]
    """Steps in order; commands where one exists."""
    changes: tuple[Change, ...] = ()
    weight: int = 50
    """How directly this explains a breakage (higher first, within a severity)."""
    keywords: tuple[str, ...] = ()
    """Symptom words (error text) that point at this finding."""
