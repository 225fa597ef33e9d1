"""The diff rules run: every rule in ``ALL_RULES``, the findings ranked, re-ranked by a
pasted symptom. Reached through the package's face (``from envguard.explain import
explain``), which loads this module on first use.
"""

from __future__ import annotations

import re

from envguard.changes import SnapshotDiff, diff
from envguard.explain import caches, conda, environment, packages, torch
from envguard.explain.culprits import ordered, suspects
from envguard.explain.error_forms import read_error
from envguard.explain.interface import Context, Finding, Rule
from envguard.explain.pointed import for_diff
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


def _split(finding: Finding, names: tuple[str, ...], ctx: Context) -> list[Finding]:
    """``finding`` as its rule gives it for the suspects' changes alone and for the others
    alone, where it groups both (``3 package(s) changed version``): the suspect's change
    becomes a finding of its own, with its own remedy. Else ``finding`` itself."""
    mine = [c for c in finding.changes if c.section in _PACKAGE_SECTIONS]
    hit = {id(c) for c in mine if c.key in names}
    rule = _RULES_BY_ID.get(finding.rule)
    if not hit or len(hit) == len(mine) or rule is None:
        return [finding]
    out: list[Finding] = []
    for leave_out in ({id(c) for c in mine} - hit, hit):  # changes are compared by identity
        part = Context(old=ctx.old, new=ctx.new, diff=SnapshotDiff(
            tuple(c for c in ctx.diff.changes if id(c) not in leave_out)))
        out.extend(f for f in rule.check(part) if f.rule == finding.rule)
    return out or [finding]


_PACKAGE_SECTIONS = ("packages", "conda")


def explain(old: Snapshot, new: Snapshot, changes: SnapshotDiff | None = None,
            symptom: str | None = None) -> list[Finding]:
    """Findings, most likely cause first.

    Without a symptom: by severity, then by how directly the rule explains a breakage.
    With one: findings about a distribution the error names (its module, a requirement
    message: :mod:`envguard.explain.culprits`) come first, a grouped finding split so the
    suspect's change stands alone; the rest by severity, and within one severity by how
    strongly the symptom points at each (:func:`symptom_score`).
    """
    ctx = Context(old=old, new=new, diff=changes if changes is not None else diff(old, new))
    findings = [f for rule in ALL_RULES for f in rule.check(ctx)]
    facts = read_error(symptom)
    names = suspects(facts, (new, old), symptom) if symptom else ()
    if names:
        findings = [part for f in findings for part in _split(f, names, ctx)]
    if symptom:
        findings += for_diff(facts, new, old)
    return ordered(findings, symptom, (new, old), symptom_score, names)
