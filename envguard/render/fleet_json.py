"""``envguard fleet diff --format json``: schema ``envguard.fleet-diff/1`` (docs/FLEET.md)."""

from __future__ import annotations

import json
from typing import Any

from envguard.fleet.analyse import FLEET_DIFF_SCHEMA, FleetReport, Member
from envguard.render.diff_json import change_dict, finding_dict


def member_dict(m: Member) -> dict[str, Any]:
    return {"name": m.name, "rank": m.rank, "host": m.host, "label": m.label}


def render(report: FleetReport) -> str:
    doc = {
        "schema": FLEET_DIFF_SCHEMA,
        "equivalent": report.equivalent,
        "verdict": report.verdict,
        "total": report.total,
        "baseline": {"name": report.baseline_name, "reason": report.baseline_reason,
                     "members": [member_dict(m) for m in report.baseline.members]},
        "outliers": [{"members": [member_dict(m) for m in g.members],
                      "rules": [f.rule for f in g.findings],
                      "findings": [finding_dict(f) for f in g.findings],
                      "changes": [change_dict(c) for c in g.diff.material]}
                     for g in report.outliers],
        "ignored_variables": list(report.ignored_variables),
        "notes": list(report.notes),
    }
    return json.dumps(doc, indent=2, sort_keys=True, ensure_ascii=True) + "\n"
