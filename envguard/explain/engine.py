"""The diff rules run: every rule in ``ALL_RULES``, the findings ranked, re-ranked by a
pasted symptom. Reached through the package's face (``from envguard.explain import
explain``), which loads this module on first use.
"""

from __future__ import annotations

import re

from envguard.changes import SnapshotDiff, diff
from envguard.explain import caches, conda, environment, packages, torch
from envguard.explain.interface import Context, Finding, Rule
from envguard.explain.symptoms import table_score
from envguard.model import Snapshot

__all__ = ["ALL_RULES", "explain", "matches_symptom", "symptom_score"]

ALL_RULES: tuple[Rule, ...] = (*torch.RULES, *caches.RULES, *packages.RULES,
                               *conda.RULES, *environment.RULES)
_RULES_BY_ID = {rule.id: rule for rule in ALL_RULES}


def symptom_score(finding: Finding, symptom: str) -> int:
    """How strongly ``symptom`` points at the finding: the weight of the rows of the
    symptom table (:mod:`envguard.explain.symptoms`) that name its rule, plus one for each
    distinct keyword of the finding (and its rule) that occurs in ``symptom``."""
    text = re.sub(r"\s+", " ", symptom.lower())
    rule = _RULES_BY_ID.get(finding.rule)
    words = {w.lower() for w in (*(rule.keywords if rule else ()), *finding.keywords) if w}
    return table_score(finding, symptom) + sum(1 for w in words if w in text)


def matches_symptom(finding: Finding, symptom: str) -> bool:
    """Whether any keyword of the finding's rule, or of the finding itself, is in ``symptom``."""
    return symptom_score(finding, symptom) > 0


def explain(old: Snapshot, new: Snapshot, changes: SnapshotDiff | None = None,
            symptom: str | None = None) -> list[Finding]:
    """Findings, most likely cause first.

    Without a symptom: by severity, then by how directly the rule explains a breakage.
    With one: findings whose keywords the symptom mentions come first, more matches first.
    """
    ctx = Context(old=old, new=new, diff=changes if changes is not None else diff(old, new))
    findings = [f for rule in ALL_RULES for f in rule.check(ctx)]

    def rank(f: Finding) -> tuple[int, int, int, str]:
        score = symptom_score(f, symptom) if symptom else 0
        return (-score, f.severity.rank, -f.weight, f.rule)

    return sorted(findings, key=rank)
