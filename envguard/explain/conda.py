"""Rules about conda packages (``conda-meta/``): changed, added, removed, from another
channel, or installed over by pip/uv."""

from __future__ import annotations

from collections.abc import Iterator

from envguard.changes import ADDED, REMOVED, Change
from envguard.explain.interface import Context, Finding, Rule, Severity
from envguard.explain.queries import overlap_finding
from envguard.explain.remedies import conda_command, remedy
from envguard.explain.tables import is_conda_core


def _by_key(ctx: Context) -> dict[str, list[Change]]:
    out: dict[str, list[Change]] = {}
    for c in ctx.diff.find("conda"):
        out.setdefault(c.key, []).append(c)
    return out


def conda_package_changed(ctx: Context) -> Iterator[Finding]:
    changed = {k: v for k, v in _by_key(ctx).items()
               if any(c.field in ("version", "build", "fingerprint") for c in v)}
    if not changed:
        return
    core = sorted(k for k in changed if is_conda_core(k))
    lines = []
    for name, cs in sorted(changed.items()):
        for c in cs:
            if c.field in ("version", "build", "fingerprint"):
                lines.append(f"{name} {c.field}: {c.old} → {c.new}")
    yield Finding(
        rule="conda-package-changed",
        severity=Severity.CRITICAL if core else Severity.WARNING,
        title=f"conda package(s) changed: {', '.join(core or sorted(changed))[:200]}",
        explanation="A conda package of this environment is now another version or build. "
                    "CUDA, cuDNN, NCCL, MKL/BLAS, compilers and pytorch itself come as conda "
                    "packages in conda and pixi environments; a change there changes the "
                    "kernels and libraries torch loads without any pip package moving.",
        evidence=tuple(lines[:20]),
        remedy=(remedy(lambda: conda_command("install", _specs(ctx, sorted(changed))),
                       suffix="  (the old versions and builds), or envguard restore with the "
                       "good snapshot for the whole env"),),
        changes=tuple(c for cs in changed.values() for c in cs), weight=93 if core else 60,
        keywords=tuple(sorted(changed)))


def _specs(ctx: Context, names: list[str]) -> list[str]:
    old = {p.name: p for p in ctx.old.conda}
    return [f"{n}={old[n].version}={old[n].build}" for n in names if n in old][:8]


def conda_package_added(ctx: Context) -> Iterator[Finding]:
    added = [c for c in ctx.diff.find("conda") if c.kind == ADDED]
    if not added:
        return
    core = [c.key for c in added if is_conda_core(c.key)]
    yield Finding(
        rule="conda-package-added",
        severity=Severity.WARNING if core else Severity.INFO,
        title=f"{len(added)} conda package(s) added: {', '.join(c.key for c in added[:6])}",
        explanation="New conda packages; CUDA or BLAS libraries among them can be loaded "
                    "instead of the ones torch was tested with.",
        evidence=tuple(f"+ {c.key} {c.new}" for c in added[:20]),
        remedy=(remedy(lambda: conda_command("remove", [c.key for c in added[:8]]),
                       suffix="  (if they should not be there)"),),
        changes=tuple(added), weight=40, keywords=tuple(c.key for c in added))


def conda_package_removed(ctx: Context) -> Iterator[Finding]:
    removed = [c for c in ctx.diff.find("conda") if c.kind == REMOVED]
    if not removed:
        return
    core = [c.key for c in removed if is_conda_core(c.key)]
    old = {p.name: p for p in ctx.old.conda}
    yield Finding(
        rule="conda-package-removed",
        severity=Severity.CRITICAL if core else Severity.WARNING,
        title=f"conda package(s) removed: {', '.join(c.key for c in removed[:6])}",
        explanation="A library the environment had is gone: whatever links against it "
                    "fails to load (`cannot open shared object file`), or falls back to "
                    "another copy.",
        evidence=tuple(f"- {c.key} {c.old}" for c in removed[:20]),
        remedy=(remedy(lambda: conda_command("install", [
            f"{c.key}={old[c.key].version}={old[c.key].build}" for c in removed[:8]])),),
        changes=tuple(removed), weight=90 if core else 55,
        keywords=(*(c.key for c in removed), "cannot open shared object"))


def conda_channel_changed(ctx: Context) -> Iterator[Finding]:
    moved = [c for c in ctx.diff.find("conda") if c.field == "channel"]
    if not moved:
        return
    yield Finding(
        rule="conda-channel-changed", severity=Severity.WARNING,
        title=f"conda package(s) now from another channel: "
              f"{', '.join(c.key for c in moved[:6])}",
        explanation="conda-forge, defaults and the pytorch/nvidia channels build the same "
                    "names differently (CUDA, BLAS, OpenMP, compilers); a package that "
                    "switched channel is the classic source of mixed CUDA builds and "
                    "clobbered libraries.",
        evidence=tuple(f"{c.key}: {c.old} → {c.new}" for c in moved[:20]),
        remedy=("pin the channel (conda config --set channel_priority strict, or "
                "`channel::name` in the spec) and install the old channel's build again",),
        changes=tuple(moved), weight=70, keywords=tuple(c.key for c in moved))


def conda_pip_overlap(ctx: Context) -> Iterator[Finding]:
    overlap = [c for c in ctx.diff.find("conda") if c.field == "pip_also" and c.new]
    if overlap:
        yield overlap_finding([f"{c.key}: a {c.new} install sits on conda's record"
                               for c in overlap], [c.key for c in overlap], tuple(overlap))


RULES = (
    Rule(id="conda-package-changed", title="conda package version or build changed",
         check=conda_package_changed, keywords=("conda", "cudatoolkit", "mkl")),
    Rule(id="conda-package-added", title="conda package added", check=conda_package_added),
    Rule(id="conda-package-removed", title="conda package removed",
         check=conda_package_removed, keywords=("cannot open shared object",)),
    Rule(id="conda-channel-changed", title="conda package from another channel",
         check=conda_channel_changed),
    Rule(id="conda-pip-overlap", title="pip installed over a conda package",
         check=conda_pip_overlap),
)
