"""Rules about installed distributions and the files they installed."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator

from envguard.changes import ADDED, REMOVED, Change
from envguard.explain.interface import (
    Context,
    Finding,
    Rule,
    Severity,
    short,
)
from envguard.explain.queries import (
    built_here,
    clean_then_reinstall,
    conda_reinstall,
    edit_in_uv_cache,
    shared_note,
    shared_story,
)
from envguard.explain.remedies import (
    UnsafeValue,
    field_key,
    pin,
    reinstall_source,
    remedy,
    uv_pip_install,
    uv_pip_uninstall,
)
from envguard.explain.tables import (
    CORE_PACKAGES,
    TORCH_OWNED,
    VERIFY_HASH_HINT,
    is_cuda_wheel,
    is_serving_stack,
)
from envguard.model import Distribution, Snapshot


def foreign_stack_installed(ctx: Context) -> Iterator[Finding]:
    added = [c for c in ctx.diff.find("packages") if c.kind == ADDED and c.field is None]
    foreign = [c for c in added if is_serving_stack(c.key)]
    if not foreign:
        return
    dragged = [c for c in ctx.diff.find("torch") if c.key in ("version", "git_version", "cuda",
                                                               "cuda_wheel_family")]
    cuda_added = [c.key for c in added if is_cuda_wheel(c.key)]
    evidence = ["added: " + ", ".join(f"{c.key} {c.new}" for c in foreign)]
    if dragged:
        evidence.append("in the same change: " + "; ".join(
            f"torch {c.key} {c.old} → {c.new}" for c in dragged))
    if cuda_added:
        evidence.append(f"and {len(cuda_added)} CUDA wheels: " + ", ".join(cuda_added[:8])
                        + (" …" if len(cuda_added) > 8 else ""))
    names = " ".join(c.key for c in foreign)
    yield Finding(
        rule="foreign-stack-installed",
        severity=Severity.CRITICAL if dragged else Severity.WARNING,
        title=f"inference packages went into the training environment ({names})",
        explanation=(
            "Serving stacks pin their own torch, CUDA wheels and triton, and JIT-compile "
            "kernels against them. Installing one into a training venv silently replaces or "
            "mixes those (measured: one pip install of common ML packages replaced torch "
            "2.13.0+cpu with 2.14.1 and added 18 nvidia/cuda wheels, without a prompt)."
        ),
        evidence=tuple(evidence),
        remedy=(
            "keep serving and training in separate venvs",
            remedy(lambda: uv_pip_uninstall([c.key for c in foreign]), "remove them here: "),
            "then check torch with envguard diff again; if it moved, reinstall the good build",
        ),
        changes=tuple(foreign),
        weight=85,
        keywords=tuple(c.key for c in foreign),
    )


def _version(ctx: Context, name: str) -> str | None:
    dist = ctx.new.package(name)
    return dist.version if dist is not None else None


def _others(ctx: Context, field: str) -> list[Change]:
    return [c for c in ctx.diff.find("packages") if c.field == field
            and c.key not in TORCH_OWNED]


def package_build_changed(ctx: Context) -> Iterator[Finding]:
    changed = _others(ctx, "fingerprint")
    if not changed:
        return
    local = [c.key for c in changed if (built_here(ctx.new.package(c.key))
                                        and not built_here(ctx.old.package(c.key)))
             or _lost_compiled(ctx, c.key)]
    yield Finding(
        # an index's wheel replaced by a build made here: its optional parts may be gone
        rule="package-build-changed",
        severity=Severity.CRITICAL if local else Severity.WARNING,
        title=f"{len(changed)} package(s) kept their version but are another build: "
              + ", ".join(c.key for c in changed[:6]) + (" …" if len(changed) > 6 else "")
              + (f" ({', '.join(local[:3])} rebuilt here from source, without the "
                 "index wheel's compiled parts)" if local else ""),
        explanation=(
            "Same version, different files: a rebuilt wheel, a wheel from another index "
            "(PyPI vs download.pytorch.org), or a local build. Version-pinned locks cannot "
            "see it; compiled extensions in it may target another torch or CUDA."
            + (" A build made here from the sdist (a bare linux_* wheel tag, which no index "
               "serves, or a pure-Python wheel where the index's had compiled code) lacks "
               "the optional compiled parts of the published wheel: PyYAML without libyaml "
               "has no CLoader." if local else "")
        ),
        evidence=tuple(f"{c.key} {_version(ctx, c.key)}: {short(c.old, 16)} → "
                       f"{short(c.new, 16)}" for c in changed)
        + tuple(f"{name}: wheel tag {', '.join(_tags(ctx, name))} (built here; GOOD's: "
                f"{', '.join(_tags(ctx, name, ctx.old))})" for name in local),
        remedy=_exact_reinstalls(ctx, changed),
        changes=tuple(changed),
        weight=60,
        keywords=(*(c.key for c in changed),
                  *(("cannot import name", "has no attribute", "C extension", "_speedups")
                    if local else ())),
    )


def _lost_compiled(ctx: Context, name: str) -> bool:
    """GOOD's build had compiled code (a platform tag), NOW's of the same version is pure
    Python (``py3-none-any``): built from the sdist without its optional extension."""
    old, new = ctx.old.package(name), ctx.new.package(name)
    return bool(old and new and old.wheel_tags and new.wheel_tags
                and not any(t.endswith("-none-any") for t in old.wheel_tags)
                and all(t.endswith("-none-any") for t in new.wheel_tags))


def _tags(ctx: Context, name: str, snapshot: Snapshot | None = None) -> list[str]:
    dist = (snapshot or ctx.new).package(name)
    return dist.wheel_tags if dist else []


def _exact_reinstalls(ctx: Context, changed: list[Change]) -> tuple[str, ...]:
    """Reinstall commands for the good builds whose wheel file or URL the good snapshot
    records; prose where it records none (the index may serve another build)."""
    found = (ctx.old.package(c.key) for c in changed[:5])
    commands = [line for dist in found if dist is not None and dist.direct_url is not None
                for line in (_reinstall_from(dist),) if line]
    return (*commands, "reinstall the good wheels from the files or URLs they came from "
            "(envguard restore --find-links with a folder of them finds the exact builds), "
            "then re-run envguard diff")


def _reinstall_from(dist: Distribution) -> str | None:
    """``uv pip install --reinstall --no-deps -- WHEEL`` from the wheel file or URL ``dist``
    was installed from; None for a folder or a VCS checkout."""
    field = f"packages.{field_key(dist.name)}"
    try:
        source = reinstall_source(dist.direct_url, dist.name, dist.version or "", field,
                                  exists=lambda _path: True)
    except UnsafeValue as exc:
        return f"(no command: {exc})"
    if source is None:
        return None
    return remedy(lambda: uv_pip_install([source], reinstall=True, no_deps=True, field=field))


def _reinstall_pin(name: str, version: str, snapshot: Snapshot | None = None) -> str:
    """``uv pip install --reinstall --no-deps -- "NAME==VERSION"``, after ``uv cache clean``
    where ``snapshot`` shows the edit is in uv's cache too."""
    def build() -> list[str]:
        return uv_pip_install([pin(name, version, f"packages.{field_key(name)}")],
                              reinstall=True, no_deps=True)

    if snapshot is not None and edit_in_uv_cache(snapshot, name):
        return clean_then_reinstall(name, build)
    return remedy(build)


def bump_kind(old: str | None, new: str | None) -> str:
    """``major``, ``minor``, ``patch``, ``local`` (only the +label) or ``other``."""
    from packaging.version import InvalidVersion, Version

    try:
        a, b = Version(old or ""), Version(new or "")
    except InvalidVersion:
        return "other"
    if a.public == b.public:
        return "local" if a.local != b.local else "other"
    ra, rb = ((*a.release, 0, 0, 0))[:3], ((*b.release, 0, 0, 0))[:3]
    if ra[0] != rb[0]:
        return "major"
    if ra[1] != rb[1]:
        return "minor"
    return "patch"


def package_version_changed(ctx: Context) -> Iterator[Finding]:
    changed = _others(ctx, "version")
    if not changed:
        return
    from packaging.version import InvalidVersion, Version

    torch_deps = {re.split(r"[ ;<>=!~\[(]", r, maxsplit=1)[0].lower().replace("_", "-")
                  for p in (ctx.old.package("torch"),) if p for r in p.requires}
    core = CORE_PACKAGES | torch_deps

    def order(c: Change) -> tuple[int, str]:
        return (0 if c.key in core or is_cuda_wheel(c.key) else 1, c.key)

    changed.sort(key=order)
    lines, serious = [], False
    for c in changed:
        kind = bump_kind(c.old, c.new)
        direction = ""
        with contextlib.suppress(InvalidVersion):
            direction = " (downgrade)" if Version(c.new) < Version(c.old) else ""
        is_core = order(c)[0] == 0
        serious |= kind == "major" or (is_core and kind in ("minor", "local"))
        lines.append(f"{c.key}: {c.old} → {c.new}, {kind}{direction}"
                     + (" [core]" if is_core else ""))
    yield Finding(
        rule="package-version-changed",
        severity=Severity.WARNING if serious else Severity.INFO,
        title=f"{len(changed)} package(s) changed version: "
              + ", ".join(c.key for c in changed[:6]) + (" …" if len(changed) > 6 else ""),
        explanation=(
            "Upgrades and downgrades change APIs and defaults; the core dependencies of the "
            "trainer (torch's own requirements, transformers, numpy, CUDA wheels) are listed "
            "first. A local-label change (+cu128 → +cu130) is a different build entirely."
        ),
        evidence=tuple(lines),
        remedy=(remedy(lambda: uv_pip_install(
            [pin(c.key, str(c.old), f"packages.{field_key(c.key)}")
             for c in changed[:10] if c.old]), "pin the good versions: "),),
        changes=tuple(changed),
        weight=50,
        keywords=tuple(c.key for c in changed),
    )


def package_added(ctx: Context) -> Iterator[Finding]:
    added = [c for c in ctx.diff.find("packages") if c.kind == ADDED and c.field is None
             and not is_serving_stack(c.key)]
    if not added:
        return
    yield Finding(
        rule="package-added", severity=Severity.INFO,
        title=f"{len(added)} package(s) appeared: " + ", ".join(c.key for c in added[:8])
              + (" …" if len(added) > 8 else ""),
        explanation="New distributions can shadow modules, register plugins or entry points, "
                    "and usually arrive with dependency upgrades.",
        evidence=tuple(f"{c.key} {c.new}" for c in added),
        remedy=(remedy(lambda: uv_pip_uninstall([c.key for c in added[:10]]), "if unwanted: "),),
        changes=tuple(added), weight=20, keywords=tuple(c.key for c in added))


def package_removed(ctx: Context) -> Iterator[Finding]:
    removed = [c for c in ctx.diff.find("packages") if c.kind == REMOVED and c.field is None]
    if not removed:
        return
    yield Finding(
        rule="package-removed", severity=Severity.WARNING,
        title=f"{len(removed)} package(s) disappeared: " + ", ".join(c.key for c in removed[:8])
              + (" …" if len(removed) > 8 else ""),
        explanation="Code that imports them now fails with ModuleNotFoundError, or falls back "
                    "to a slower path when the import is optional (fused kernels, tokenizers).",
        evidence=tuple(f"{c.key} {c.old}" for c in removed),
        remedy=(remedy(lambda: uv_pip_install(
            [pin(c.key, str(c.old), f"packages.{field_key(c.key)}") for c in removed[:10]])),),
        changes=tuple(removed), weight=40,
        keywords=("modulenotfounderror", "no module named", *(c.key for c in removed)))


_SPECIAL_KINDS = ("not-a-regular-file", "outside-install-tree")
_SPECIAL_FILES = (
    " Some are not files at all: not-a-regular-file is a FIFO, a device or a folder where "
    "RECORD lists a file (a symlink to /dev/zero, say), and outside-install-tree is a RECORD "
    "path that leaves the environment's prefix (../../../../dev/zero, an absolute path). "
    "envguard did not read them (a FIFO blocks a reader forever, /dev/zero never ends); "
    "nor should anything else: reinstall the package and look for who put them there."
)


def installed_files_modified(ctx: Context) -> Iterator[Finding]:
    new_issues = [c for c in ctx.diff.find("integrity") if c.new is not None]
    if not new_issues:
        return
    packages = sorted({c.key for c in new_issues})
    versions = {p: _version(ctx, p) for p in packages}
    # Written after install, same size: only the time says so (an exact revert also looks
    # like this); --verify hash tells an edit from a revert.
    by_time_only = all(c.new == "modified-after-install" for c in new_issues)
    found = {(i.package, i.path): i for i in ctx.new.integrity.issues}
    notes = {(c.key, c.field): shared_note(found[c.key, c.field or ""])
             for c in new_issues if (c.key, c.field or "") in found}
    yield Finding(
        rule="installed-files-modified",
        severity=Severity.WARNING if by_time_only else Severity.CRITICAL,
        title=f"{len(new_issues)} installed file(s) no longer match their RECORD, in "
              + ", ".join(packages[:5]) + (" …" if len(packages) > 5 else ""),
        explanation=(
            "Someone edited, replaced or deleted files inside site-packages (a monkey-patch "
            "while debugging, a half-finished install). pip and uv still report the package "
            "as installed and unchanged. An edit to a torch .py file also changes torch's "
            "source hash, so every compile-cache entry misses."
            + (_SPECIAL_FILES if any(c.new in _SPECIAL_KINDS for c in new_issues) else "")
            + shared_story(ctx.new, packages)
            + (" Seen by modification time only, with sizes unchanged: " + VERIFY_HASH_HINT + "."
               if by_time_only else "")
        ),
        evidence=tuple(f"{c.key}: {c.field} ({c.new}{notes.get((c.key, c.field), '')})"
                       for c in new_issues[:20])
        + ((f"… and {len(new_issues) - 20} more",) if len(new_issues) > 20 else ()),
        remedy=tuple(conda_reinstall(ctx.new, p) if p.startswith("conda:") else
                     _reinstall_pin(p, str(versions[p]), ctx.new)
                     for p in packages[:5] if versions[p] or p.startswith("conda:"))
        + ((VERIFY_HASH_HINT,) if by_time_only else ()) or ("reinstall the affected packages",),
        changes=tuple(new_issues),
        weight=97,
        keywords=(*packages, *{c.field.rsplit("/", 1)[-1].removesuffix(".py")
                               for c in new_issues if c.field}),
    )


def known_break(ctx: Context) -> Iterator[Finding]:
    """A pair of the knowledge base (:mod:`envguard.explain.knowledge`) that NOW meets and
    GOOD did not: the change that made it is the likely cause."""
    from envguard.explain.knowledge import broken_pairs, pair_finding

    before = {p.entry.id for p in broken_pairs(ctx.old)}
    for pair in broken_pairs(ctx.new):
        if pair.entry.id in before:
            continue
        changes = tuple(c for c in ctx.diff.find("packages")
                        if c.key in (pair.dependency.name, pair.package.name))
        yield pair_finding(pair, changes)


RULES = (
    Rule(id="known-break", title="a known break between two installed versions",
         check=known_break),
    Rule(id="foreign-stack-installed", title="serving/inference stack installed",
         check=foreign_stack_installed,
         keywords=("undefined symbol", "flashinfer", "sglang", "vllm", "xformers", "tilelang",
                   "nccl", "importerror", "version conflict")),
    Rule(id="installed-files-modified", title="site-packages files differ from RECORD",
         check=installed_files_modified,
         keywords=("is_fx_symbolic_tracing", "monkey", "patch", "attributeerror", "nameerror",
                   "syntaxerror")),
    Rule(id="package-build-changed", title="same version, different build",
         check=package_build_changed, keywords=("undefined symbol", "abi")),
    Rule(id="package-version-changed", title="package upgraded or downgraded",
         check=package_version_changed,
         keywords=("importerror", "attributeerror", "has no attribute", "deprecat",
                   "unexpected keyword", "typeerror")),
    Rule(id="package-added", title="package added", check=package_added),
    Rule(id="package-removed", title="package removed", check=package_removed,
         keywords=("modulenotfounderror", "no module named")),
)
