"""``--format json``: a stable, documented schema (docs/DIFF.md)."""

from __future__ import annotations

import json
from typing import Any

from envguard.changes import Change
from envguard.explain import Finding
from envguard.render.report import DIFF_SCHEMA, DiffReport


def change_dict(c: Change) -> dict[str, Any]:
    return {"section": c.section, "key": c.key, "field": c.field, "kind": c.kind,
            "old": c.old, "new": c.new, "material": c.material, "path": c.path}


def finding_dict(f: Finding) -> dict[str, Any]:
    return {"rule": f.rule, "severity": f.severity.value, "title": f.title,
            "explanation": f.explanation, "evidence": list(f.evidence),
            "remedy": list(f.remedy), "changes": [c.path for c in f.changes]}


def render(report: DiffReport) -> str:
    doc = {
        "schema": DIFF_SCHEMA,
        "old": report.old_name,
        "new": report.new_name,
        "equivalent": report.equivalent,
        "verdict": report.verdict,
        "symptom": report.symptom,
        "findings": [finding_dict(f) for f in report.findings],
        "changes": [change_dict(c) for c in report.diff.changes],
    }
    return json.dumps(doc, indent=2, sort_keys=True, ensure_ascii=True) + "\n"
