"""What ``envguard restore`` reports: the plan, then (once built) the verification."""

from __future__ import annotations

from dataclasses import dataclass

from envguard.restore.plan import PLAN_SCHEMA, RestorePlan, plan_to_dict
from envguard.restore.verify import Verification, verification_to_dict


@dataclass(frozen=True, kw_only=True, slots=True)
class RestoreReport:
    plan: RestorePlan
    in_place: bool = False
    target: str | None = None
    """The restored environment's folder; None until it is built (or with --dry-run)."""
    verification: Verification | None = None

    def to_dict(self) -> dict[str, object]:
        """The ``envguard.restore/1`` document (docs/RESTORE.md)."""
        return {"schema": PLAN_SCHEMA, "plan": plan_to_dict(self.plan), "target": self.target,
                "in_place": self.in_place,
                "verification": (verification_to_dict(self.verification)
                                 if self.verification is not None else None)}
