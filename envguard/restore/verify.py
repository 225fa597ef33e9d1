"""Prove a restore: does the restored environment reproduce GOOD's package set?

:func:`verify_restore` compares GOOD with a snapshot of the result, looking only at
packages (and the torch build that they determine), never at paths, host, caches or
environment variables; and it reads the result's installed files against their RECORD
(:func:`proof_snapshot` takes that snapshot with ``--verify hash``). Same versions and
builds are not enough: uv installs from its cache, by hard link on Linux, and an edit made
in any venv linked from the cache comes back in every venv built from it.
"""

from __future__ import annotations

import dataclasses

from envguard.changes import ADDED, REMOVED, Change, diff
from envguard.explain import Finding, explain
from envguard.explain.queries import edit_in_uv_cache, shared_note
from envguard.explain.remedies import remedy, uv_cache_clean
from envguard.frozen import frozen
from envguard.model import IntegrityIssue, Snapshot

_IGNORED_TORCH_FIELDS = frozenset({"compat_key", "location"})


@frozen
class Unreproduced:
    name: str
    problem: str
    """``missing``, ``extra``, ``version``, ``build``, ``source``, ``editable``, ``files``
    (installed files differ from RECORD) or ``other``."""
    good: str | None
    new: str | None
    detail: str
    rule: str | None = None
    """The diff rule whose finding has the evidence (``torch-build-changed``)."""


@frozen
class Verification:
    good_name: str
    new_name: str
    unreproduced: tuple[Unreproduced, ...]
    findings: tuple[Finding, ...]
    """Package-related findings of ``envguard diff GOOD NEW``."""
    ignored: tuple[str, ...]
    """Material differences outside the package set (paths, host, caches, variables)."""

    @property
    def ok(self) -> bool:
        return not self.unreproduced


def _build_rule(name: str) -> str:
    if name == "torch":
        return "torch-build-changed"
    if name in ("triton", "pytorch-triton"):
        return "triton-changed"
    return "package-build-changed"


def _unreproduced(c: Change, good: Snapshot, good_name: str) -> Unreproduced:
    name = c.key
    if c.kind == REMOVED:
        return Unreproduced(name=name, problem="missing", good=c.old, new=None,
                            detail=f"{name} {c.old} is not installed in the restored env")
    if c.kind == ADDED:
        return Unreproduced(name=name, problem="extra", good=None, new=c.new,
                            detail=f"{name} {c.new} is installed but not in {good_name}")
    if c.field == "fingerprint":
        dist = good.package(name)
        version = dist.version if dist else "?"
        return Unreproduced(
            name=name, problem="build", good=c.old, new=c.new, rule=_build_rule(name),
            detail=(f"{name} {version}: same version, different build: RECORD fingerprint "
                    f"{c.old} in {good_name}, {c.new} restored. The index (or --find-links) "
                    "now serves another build under the same version string (see the "
                    f"{_build_rule(name)} finding); install the good wheel file itself, "
                    "e.g. --find-links a folder holding it"))
    problem = c.field if c.field in ("version", "editable") else (
        "source" if c.field == "direct_url" else "other")
    return Unreproduced(name=name, problem=problem, good=_text(c.old), new=_text(c.new),
                        detail=f"{name} {c.field}: {_text(c.old)} in {good_name}, "
                               f"{_text(c.new)} restored")


def _text(value: object) -> str | None:
    return None if value is None else str(value)


def proof_snapshot(python: str) -> Snapshot:
    """The restored environment as the check reads it: its packages, and every installed
    file hashed against its RECORD (no git, no project config, no cache sightings)."""
    from envguard.probe import collect
    from envguard.probe.options import locations_only

    return collect(dataclasses.replace(locations_only(python), verify="hash"))


def _edited(name: str, issues: list[IntegrityIssue], new: Snapshot) -> Unreproduced:
    """A package of the restored environment whose files differ from its RECORD."""
    dist = new.package(name)
    shown = ", ".join(f"{i.path} ({i.problem}{shared_note(i)})" for i in issues[:5])
    more = f" and {len(issues) - 5} more" if len(issues) > 5 else ""
    where = ("the edit is in uv's cache, hard-linked into every venv built from it"
             if edit_in_uv_cache(new, name) else
             "uv copied or linked them from its cache, which holds the edit")
    return Unreproduced(
        name=name, problem="files", good=None, new=f"{len(issues)} file(s)",
        rule="installed-files-modified",
        detail=(f"{name} {dist.version if dist else '?'}: {len(issues)} installed file(s) "
                f"differ from RECORD: {shown}{more}. Same version and build, other files: "
                f"{where}. " + remedy(lambda: uv_cache_clean([name]), "Drop it from the "
                                      "cache: ", ", then restore again")
                + " (after --in-place, a package that sync left alone keeps its edited "
                "files: envguard doctor --fix reinstalls it)"))


def _files(new: Snapshot) -> list[Unreproduced]:
    by_package: dict[str, list[IntegrityIssue]] = {}
    for issue in new.integrity.issues:
        by_package.setdefault(issue.package, []).append(issue)
    return [_edited(name, issues, new) for name, issues in sorted(by_package.items())]


def verify_restore(good: Snapshot, new: Snapshot, *, good_name: str,
                   new_name: str) -> Verification:
    """What of GOOD's package set the restored environment does not reproduce, and which of
    its packages' files differ from RECORD (when ``new`` was taken with a file check:
    :func:`proof_snapshot`)."""
    changes = diff(good, new)
    packages = [c for c in changes.material if c.section == "packages"]
    torch = [c for c in changes.material
             if c.section == "torch" and c.key not in _IGNORED_TORCH_FIELDS]
    items = [_unreproduced(c, good, good_name) for c in packages]
    if torch and not any(c.key == "torch" for c in packages):
        items += [Unreproduced(name="torch", problem="other", good=_text(c.old),
                               new=_text(c.new), detail=f"torch {c.key}: {c.old} → {c.new}")
                  for c in torch]
    items += _files(new)
    counted = packages + torch + [c for c in changes.material if c.section == "integrity"]
    findings = tuple(f for f in explain(good, new, changes)
                     if any(c in counted for c in f.changes))
    ignored = tuple(c.path for c in changes.material if c not in counted)
    return Verification(good_name=good_name, new_name=new_name, unreproduced=tuple(items),
                        findings=findings, ignored=ignored)


def verification_to_dict(v: Verification) -> dict[str, object]:
    return {
        "ok": v.ok, "good": v.good_name, "new": v.new_name,
        "unreproduced": [{"name": u.name, "problem": u.problem, "good": u.good, "new": u.new,
                          "detail": u.detail, "rule": u.rule} for u in v.unreproduced],
        "findings": [{"rule": f.rule, "severity": f.severity.value, "title": f.title,
                      "evidence": list(f.evidence)} for f in v.findings],
        "ignored": list(v.ignored),
    }
