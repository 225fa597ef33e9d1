"""Predict what an installer command would do to an environment, exactly to the build.

:func:`predict` snapshots the environment, runs the command against a scratch copy of it
(:mod:`envguard.install.scratch`), snapshots the copy, and explains the difference with
the rules ``envguard diff`` uses. The predicted snapshot is the environment's own with the
copy's packages and torch build put in (their paths written back to the environment's), so
the rules see exactly what ``envguard diff`` would see after the change, and no path noise.
A same-version rebuild is visible: the copy holds the new build's RECORD.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import stat
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from envguard.changes import ADDED, REMOVED, Change, SnapshotDiff, diff
from envguard.errors import InputError, RestoreError
from envguard.findings import Finding, Severity
from envguard.frozen import frozen
from envguard.install.command import UV, InstallerCommand, installer_environment
from envguard.install.locks import LockVerdict, broken_locks, lock_patterns, read_locks
from envguard.install.scratch import check_guard, scratch_copy, stage_away
from envguard.install.transplant import Staged, metadata_dirs
from envguard.model import Distribution, Interpreter, Snapshot
from envguard.paths import memo_dir, rebased
from envguard.probe import SnapshotOptions, collect
from envguard.probe.collector import Packages, collect_packages
from envguard.redact import redact_argv
from envguard.runs.store import now_iso

Echo = Callable[[str], None]
_IGNORED_TORCH = frozenset({"compat_key", "location"})


@frozen
class PackageChange:
    """One package the command changes: ``install``, ``remove``, ``change`` (another
    version, source or editable-ness) or ``rebuild`` (same version, another build)."""

    name: str
    action: str
    before: str | None
    after: str | None
    detail: str = ""


@frozen
class Costs:
    clone_s: float
    linked: int
    copied: int
    copied_bytes: int
    installer_s: float
    snapshots_s: float
    kept: int = 0
    """Entries of the copy kept from the last prediction found up to date."""


@frozen
class InstallPlan:
    """What the command would do: ``envguard install --dry-run``'s report."""

    environment: str
    """The environment's folder (its prefix)."""
    python: str
    command: tuple[str, ...]
    """Redacted."""
    before: Snapshot
    predicted: Snapshot
    diff: SnapshotDiff
    findings: tuple[Finding, ...]
    packages: tuple[PackageChange, ...]
    locks: tuple[LockVerdict, ...] = ()
    """Locks this environment matches now that the change would break."""
    locked_by: tuple[str, ...] = ()
    """Locks (by path) this environment matches now."""
    notes: tuple[str, ...] = ()
    costs: Costs | None = None
    staged: Staged | None = None
    """The copy the installer changed, kept so that applying the plan moves its files
    (:mod:`envguard.install.transplant`) instead of running the installer again; None when
    the plan was made without ``stage`` or the installer cannot be moved (pip, a whole
    copy). Whoever holds a plan with one applies it or calls
    :func:`~envguard.install.transplant.discard`."""

    @property
    def critical(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.severity is Severity.CRITICAL)

    @property
    def refused(self) -> bool:
        """A critical finding, or a lock the change breaks: refused unless ``--yes``."""
        return bool(self.critical or self.locks)


def snapshot_options(python: str, patterns: tuple[str, ...] = (), *,
                     memo: bool = True) -> SnapshotOptions:
    """How install, undo and their checks snapshot: packages and builds, no file check."""
    return SnapshotOptions(python=python, verify="none", use_project_config=False,
                           remember_caches=False, git=False, file_patterns=patterns,
                           use_memo=memo)


def as_environment(copy: Packages, of: Snapshot, copy_prefix: str, prefix: str) -> Snapshot:
    """``of`` with ``copy``'s packages and torch build, their paths moved from
    ``copy_prefix`` to ``prefix``."""
    def moved(path: str) -> str:
        return rebased(path, copy_prefix, prefix)

    def same(d: Distribution, b: Distribution | None) -> bool:
        return b is not None and (b.version, b.fingerprint, b.direct_url, b.editable) == (
            d.version, d.fingerprint, d.direct_url, d.editable)

    # a package the command left alone is the environment's own record (the copy may lack
    # its files); a new one is the copy's, at the environment's paths
    packages = [b if same(d, b := of.package(d.name)) and b is not None
                else dataclasses.replace(d, location=moved(d.location),
                                         metadata_dir=moved(d.metadata_dir),
                                         shadowed=[moved(p) for p in d.shadowed])
                for d in copy.packages]
    torch = dataclasses.replace(copy.torch, location=moved(copy.torch.location)
                                if copy.torch.location else None)
    return dataclasses.replace(of, packages=packages, torch=torch)


def _record_keys(copy: Packages, before: Snapshot, folder: str, copy_prefix: str,
                 prefix: str) -> dict[str, tuple[int, int, int]]:
    """(inode, size, mtime) of the RECORD of each distribution the installer wrote into the
    copy (now at ``folder``), by the path it will have in the environment."""
    out = {}
    for d in copy.packages:
        old = before.package(d.name)
        if old is not None and old.fingerprint == d.fingerprint and \
                old.metadata_dir == d.metadata_dir:
            continue  # the environment's own, linked
        rel = os.path.relpath(os.path.join(d.location, d.metadata_dir, "RECORD"), copy_prefix)
        if rel.startswith(".."):
            continue
        with contextlib.suppress(OSError):
            st = os.lstat(os.path.join(folder, rel))
            if stat.S_ISREG(st.st_mode):
                out[os.path.join(prefix, rel)] = (st.st_ino, st.st_size, st.st_mtime_ns)
    return out


def package_changes(changes: SnapshotDiff) -> tuple[PackageChange, ...]:
    """The diff's package changes, one row per package."""
    rows: dict[str, PackageChange] = {}
    for c in changes.material:
        if c.section != "packages":
            continue
        if c.kind == ADDED:
            rows[c.key] = PackageChange(name=c.key, action="install", before=None, after=c.new)
        elif c.kind == REMOVED:
            rows[c.key] = PackageChange(name=c.key, action="remove", before=c.old, after=None)
        elif c.field == "fingerprint" and c.key not in rows:
            rows[c.key] = PackageChange(
                name=c.key, action="rebuild", before=None, after=None,
                detail=f"same version, another build ({str(c.old)[7:19]}… → {str(c.new)[7:19]}…)")
        elif c.field == "version":
            rows[c.key] = PackageChange(name=c.key, action="change", before=str(c.old),
                                        after=str(c.new))
        elif c.key not in rows:
            rows[c.key] = PackageChange(name=c.key, action="change", before=None, after=None,
                                        detail=f"{c.field}: {c.old} → {c.new}")
    return tuple(rows[k] for k in sorted(rows))


def _versions(rows: tuple[PackageChange, ...], before: Snapshot,
              after: Snapshot) -> tuple[PackageChange, ...]:
    out = []
    for r in rows:
        old, new = before.package(r.name), after.package(r.name)
        out.append(dataclasses.replace(r, before=r.before or (old.version if old else None),
                                       after=r.after or (new.version if new else None)))
    return tuple(out)


def differences(predicted: Snapshot, after: Snapshot) -> tuple[str, ...]:
    """Where the environment after the command differs from the prediction: its packages
    and torch build only (one line each)."""
    changes = diff(predicted, after)
    return tuple(_line(c) for c in changes.material
                 if c.section == "packages"
                 or (c.section == "torch" and c.key not in _IGNORED_TORCH))


def _line(c: Change) -> str:
    if c.kind == ADDED:
        return f"{c.key} {c.new} is installed, not predicted"
    if c.kind == REMOVED:
        return f"{c.key} {c.old} was predicted, not installed"
    return f"{c.path}: predicted {c.old}, got {c.new}"


def prefix_of(snapshot: Snapshot) -> Path:
    """The venv's folder; InputError for an interpreter outside a venv."""
    return venv_folder(snapshot.interpreter)


def venv_folder(interpreter: Interpreter) -> Path:
    """The venv's folder of ``interpreter``; InputError for one outside a venv."""
    if not interpreter.is_venv or not interpreter.prefix:
        raise InputError(f"{interpreter.executable} is not in a venv: envguard "
                         "install predicts on a copy of a venv (choose one with --python)")
    return Path(os.path.realpath(interpreter.prefix))


def same_environment(command: InstallerCommand, prefix: Path) -> None:
    """A pip or python given by path must be the environment's own: envguard runs the
    environment's interpreter, and would otherwise change another venv than the one
    named."""
    from envguard.probe.discovery import prefix_of as folder_of

    head = command.argv[0]
    if command.tool == "uv" or os.sep not in head:
        return
    theirs = os.path.realpath(folder_of(os.path.abspath(head)))
    if theirs != str(prefix):
        raise InputError(f"{head} belongs to another environment ({theirs}) than the one "
                         f"envguard predicts for ({prefix}); name it with envguard install "
                         "--python PY")


def predict(command: InstallerCommand, *, python: str, cwd: Path,
            env: Mapping[str, str] | None = None, echo: Echo | None = None,
            stage: bool = False, meanwhile: Callable[[], object] | None = None) -> InstallPlan:
    """The plan of ``command`` for the environment of ``python`` (see the module).

    uv runs on the metadata copy with the environment's own interpreter and ``--prefix``
    at the copy, so the copy receives exactly what the environment would; with ``stage``,
    that copy is kept in the plan (``plan.staged``) for :func:`~.apply.apply_install`.

    The installer runs in the background from the moment the copy exists: the
    environment's own snapshot is taken meanwhile, and ``meanwhile`` (the caller's own
    preparations, such as the imports of what comes after the prediction) is called then
    too. The environment's interpreter facts come first, from the probe's memo."""
    from envguard.probe.interpreter import (
        hand_on,
        hand_on_copy,
        interpreter_section,
        probe_python,
    )
    from envguard.restore.build import Running, error_line

    environ = installer_environment(os.environ if env is None else env)
    locks, notes = read_locks(cwd)
    patterns = lock_patterns(locks)
    started = time.perf_counter()
    options = snapshot_options(python, patterns)
    target = probe_python(python, memo_dir())
    hand_on(python, target)  # the snapshot below takes these facts
    interpreter = interpreter_section(target)
    prefix = venv_folder(interpreter)
    same_environment(command, prefix)
    rel = os.path.relpath(os.path.abspath(python), os.path.abspath(interpreter.prefix))
    rel = rel if not rel.startswith("..") else os.path.join("bin", "python")
    # First the venv's metadata only (what resolution reads); a command that fails there
    # (a build that imports the venv's own packages) is tried again on a whole copy.
    staged: Staged | None = None
    before: Snapshot | None = None
    taken = 0.0
    for sites in (interpreter.site_packages, None):
        with scratch_copy(prefix, site_packages=sites,
                          with_pip=command.tool == "pip") as (folder, guard, cloned):
            movable = command.tool == UV and sites is not None
            made = cloned.made if movable else {}
            sites_now = tuple(os.path.realpath(p) for p in sites or ())
            metadata = metadata_dirs(str(prefix), sites_now) if movable else frozenset()
            cloned_at = time.perf_counter()
            scratch_python = str(folder / rel)
            argv = (command.argv_into(python, str(folder)) if movable
                    else command.argv_for(scratch_python))
            written_at = now_iso()
            try:
                job = Running(argv, timeout=3600, echo=echo, env=environ, cwd=str(cwd))
            except OSError as exc:
                raise RestoreError(f"cannot run {argv[0]}: {exc.strerror or exc}") from None
            try:
                if before is None:
                    snapped = time.perf_counter()
                    before = collect(options)
                    taken = time.perf_counter() - snapped
                from envguard.explain import explain  # imported while the installer runs

                if meanwhile is not None:
                    meanwhile()
            except BaseException:
                job.kill()  # the installer, on the copy only; then the copy goes
                with contextlib.suppress(BaseException):
                    job.result()
                raise
            result = job.result()
            check_guard(guard)
            ran_at = time.perf_counter()
            if not result.ok and sites is not None:
                continue
            if not result.ok:
                raise RestoreError(f"the command fails on a copy of the environment (exit "
                                   f"status {result.returncode}): {error_line(result.lines)}; "
                                   "nothing was changed")
            hand_on_copy(scratch_python, target, str(folder))  # unless a .pth changed
            copy = collect_packages(
                dataclasses.replace(snapshot_options(scratch_python, memo=False),
                                    memo_of=interpreter.prefix),
                [g.name for g in before.system.gpus])
            copy_prefix = os.path.realpath(copy.interpreter.prefix)
            if movable and stage:
                staged = Staged(folder=str(stage_away(folder, prefix)), prefix=str(prefix),
                                before=made, sites=sites_now, metadata_dirs=metadata,
                                guard=guard, lines=tuple(result.lines),
                                started_at=written_at)
            break
    assert before is not None  # noqa: S101 - taken on the first pass
    predicted = as_environment(copy, before, copy_prefix, str(prefix))
    changes = diff(before, predicted)
    if staged is not None:
        staged = dataclasses.replace(staged, records=_record_keys(
            copy, before, staged.folder, copy_prefix, str(prefix)))
    findings = tuple(explain(before, predicted, changes))
    broken, locked_by = broken_locks(before, predicted, locks)
    done = time.perf_counter()
    costs = Costs(clone_s=cloned_at - started, linked=cloned.linked,
                  copied=cloned.copied, copied_bytes=cloned.copied_bytes,
                  installer_s=ran_at - cloned_at, snapshots_s=taken + done - ran_at,
                  kept=cloned.kept)
    return InstallPlan(environment=str(prefix), python=python,
                       command=tuple(redact_argv(list(command.argv))), before=before,
                       predicted=predicted, diff=changes, findings=findings,
                       packages=_versions(package_changes(changes), before, predicted),
                       locks=broken, locked_by=locked_by, notes=notes, costs=costs,
                       staged=staged)
