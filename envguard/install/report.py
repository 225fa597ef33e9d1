"""What ``envguard install`` reports: the prediction, and (once run) how the real change
compared with it."""

from __future__ import annotations

from typing import Any

from envguard.frozen import frozen
from envguard.install.apply import Applied
from envguard.install.predict import InstallPlan

INSTALL_SCHEMA = "envguard.install/1"


@frozen
class InstallReport:
    plan: InstallPlan
    applied: Applied | None = None
    """None for ``--dry-run`` and a refusal."""
    forced: bool = False
    """``--yes`` took a refused change."""

    @property
    def verdict(self) -> str:
        """One line: what envguard decided."""
        plan = self.plan
        if self.applied is not None:
            a = self.applied
            if a.exit_code != 0:
                return f"the installer failed (exit status {a.exit_code})"
            if a.differences:
                return f"installed, but not as predicted ({len(a.differences)} difference(s))"
            return "installed as predicted" + (" (refused change taken with --yes)"
                                               if self.forced else "")
        if plan.refused:
            return "refused: " + "; ".join(
                [f.title for f in plan.critical[:2]]
                + [f"breaks lock {v.name} ({v.path})" for v in plan.locks])
        if not plan.packages:
            return "no package would change"
        return "safe: no critical finding"

    def to_dict(self) -> dict[str, Any]:
        plan = self.plan
        applied = self.applied
        return {
            "schema": INSTALL_SCHEMA, "environment": plan.environment, "python": plan.python,
            "command": list(plan.command), "verdict": self.verdict, "refused": plan.refused,
            "forced": self.forced,
            "packages": [{"name": p.name, "action": p.action, "before": p.before,
                          "after": p.after, "detail": p.detail} for p in plan.packages],
            "findings": [{"rule": f.rule, "severity": f.severity.value, "title": f.title,
                          "evidence": list(f.evidence), "remedy": list(f.remedy)}
                         for f in plan.findings],
            "locks": {"matched": list(plan.locked_by),
                      "broken": [{"name": v.name, "path": v.path,
                                  "forbidden": list(v.forbidden),
                                  "findings": [f.rule for f in v.findings]}
                                 for v in plan.locks]},
            "notes": list(plan.notes),
            "costs": None if plan.costs is None else {
                "clone_s": round(plan.costs.clone_s, 3), "linked": plan.costs.linked,
                "copied": plan.costs.copied, "copied_bytes": plan.costs.copied_bytes,
                "installer_s": round(plan.costs.installer_s, 3),
                "snapshots_s": round(plan.costs.snapshots_s, 3), "kept": plan.costs.kept},
            "applied": None if applied is None else {
                "exit_code": applied.exit_code, "as_predicted": not applied.differences,
                "moved": applied.moved, "why_run": applied.why_run,
                "differences": list(applied.differences), "interrupted": applied.interrupted,
                "revision": applied.revision.number if applied.revision else None,
                "kept": [{"name": k.name, "version": k.version, "outcome": k.outcome,
                          "detail": k.detail, "linked": k.linked, "copied": k.copied,
                          "copied_bytes": k.copied_bytes} for k in applied.kept]},
        }
