"""What ``envguard restore`` reports: the plan, then (once built) the verification; for a
conda snapshot, the spec files written and the prefix built from them."""

from __future__ import annotations

from envguard.frozen import frozen
from envguard.restore.plan import PLAN_SCHEMA, RestorePlan, plan_to_dict
from envguard.restore.verify import Verification, verification_to_dict


@frozen
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


@frozen
class CondaRestoreReport:
    """``envguard restore`` of a conda or pixi snapshot: what was written, how to rebuild
    the prefix, and (once a conda tool built it) what still differs from GOOD."""

    good_name: str
    packages: int
    """conda packages in GOOD."""
    pip_requirements: tuple[str, ...]
    """What pip or uv installed on top, pinned; installed with uv after the conda tool."""
    explicit: str
    """The ``@EXPLICIT`` spec file written (exact builds by URL and md5)."""
    environment_yml: str
    left_out: tuple[str, ...]
    """Packages with no usable URL recorded: pinned in environment.yml only."""
    platform: str | None
    target: str
    tools: tuple[str, ...]
    """The conda tools found (micromamba, mamba, conda), in the order tried."""
    commands: tuple[str, ...]
    """The commands that rebuild the prefix by hand."""
    built: bool = False
    tool: str | None = None
    differences: tuple[str, ...] = ()
    """What the rebuilt prefix holds that GOOD does not (versions, builds, unread records)."""
    then: str = ""
    """The uv command that installs the pip part after the conda tool, quoted for the
    shell (built as the one envguard runs); empty when there is none."""

    def to_dict(self) -> dict[str, object]:
        """The ``envguard.restore/1`` document, its ``conda`` member (docs/RESTORE.md)."""
        info: dict[str, object] = {
            "packages": self.packages, "explicit": self.explicit,
            "environment_yml": self.environment_yml, "left_out": list(self.left_out),
            "pip": list(self.pip_requirements), "platform": self.platform,
            "target": self.target, "tools": list(self.tools), "commands": list(self.commands),
            "built": self.built, "differences": list(self.differences)}
        if self.tool is not None:
            info["tool"] = self.tool
        return {"schema": PLAN_SCHEMA, "conda": info}
