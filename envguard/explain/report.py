"""The input of every diff renderer: two snapshots' differences and their explanation."""

from __future__ import annotations

from envguard.changes import SnapshotDiff
from envguard.findings import Finding, Severity
from envguard.frozen import frozen

DIFF_SCHEMA = "envguard.diff/1"


@frozen
class DiffReport:
    old_name: str
    new_name: str
    diff: SnapshotDiff
    findings: tuple[Finding, ...]
    symptom: str | None = None
    refused_by: str | None = None
    """A gate refusal that is not a difference (``require-warm`` with a cold cache)."""

    @property
    def equivalent(self) -> bool:
        return self.diff.equivalent and self.refused_by is None

    @property
    def verdict(self) -> str:
        """The headline: one sentence."""
        if self.refused_by is not None and self.diff.equivalent:
            return f"refused: {self.refused_by}"
        if self.equivalent:
            return "equivalent: no difference that changes behaviour"
        if not self.findings:
            n = len(self.diff.material)
            return f"{n} difference(s), none matching a known failure mode"
        top = self.findings[0]
        critical = sum(1 for f in self.findings if f.severity is Severity.CRITICAL)
        lead = "most likely cause" + (" of the symptom" if self.symptom else "")
        tail = f" ({critical} critical finding(s) in all)" if critical > 1 else ""
        return f"{lead}: {top.title}{tail}"
