"""``envguard doctor``: what is wrong with one environment, with no earlier snapshot.

collect (:func:`envguard.doctor.facts.gather`: the snapshot, the history read from the
disk, the CUDA libraries on the loader's path) → analyse (:func:`diagnose`: every rule in
:data:`ALL_RULES`, an explicit tuple) → render (:mod:`envguard.render`, the same finding
renderers as ``diff``). Rule ids are a public contract (docs/DOCTOR.md); findings have the
diff's shape (rule id, severity, evidence, remedy), and ``--symptom`` re-ranks them by
the same table (:mod:`envguard.explain.symptoms`).
"""

from __future__ import annotations

from envguard.doctor import builds, caches, cuda, packages, shadowing
from envguard.doctor.interface import DoctorRule, Scene
from envguard.explain import symptom_score, symptom_text
from envguard.explain.culprits import ordered
from envguard.explain.error_forms import read_error
from envguard.explain.interface import Finding, Severity
from envguard.explain.pointed import for_doctor
from envguard.frozen import frozen
from envguard.model import Snapshot
from envguard.redact import redact_text

__all__ = ["ALL_RULES", "DoctorReport", "DoctorRule", "Scene", "diagnose"]

ALL_RULES: tuple[DoctorRule, ...] = (*packages.RULES, *builds.RULES, *shadowing.RULES,
                                      *cuda.RULES, *caches.RULES)


@frozen
class DoctorReport:
    """The findings about one environment, most likely trouble first."""

    environment: str
    """How the environment was chosen: ``~/t/.venv (VIRTUAL_ENV)``."""
    snapshot: Snapshot
    findings: tuple[Finding, ...]
    symptom: str | None = None

    @property
    def healthy(self) -> bool:
        """No finding at warning or above (``envguard doctor`` exits 0)."""
        return not any(f.severity is not Severity.INFO for f in self.findings)

    @property
    def verdict(self) -> str:
        if not self.findings:
            return "healthy: no known problem found in this environment"
        if self.healthy:
            return f"healthy: {len(self.findings)} note(s)"
        top = self.findings[0]
        serious = sum(1 for f in self.findings if f.severity is not Severity.INFO)
        lead = "most likely trouble" + (" behind the symptom" if self.symptom else "")
        return f"{lead}: {top.title} ({serious} finding(s) at warning or above)"


def diagnose(scene: Scene, *, environment: str = "", symptom: str | None = None
             ) -> DoctorReport:
    """Run every rule on ``scene``; findings in :func:`envguard.explain.culprits.ordered`'s
    order (about what the symptom names first, then severity, then weight).
    The symptom and the environment's description enter the report redacted."""
    symptom, environment = symptom_text(symptom), redact_text(environment)
    found = [f for rule in ALL_RULES for f in rule.check(scene)]
    if symptom:
        found += for_doctor(read_error(symptom), symptom, scene.snapshot, found)
    findings = ordered(found, symptom, (scene.snapshot,), symptom_score)
    return DoctorReport(environment=environment, snapshot=scene.snapshot,
                        findings=tuple(findings), symptom=symptom)
