"""``envguard undo``: return an environment, in place, to a recorded revision, exactly to the
build, or say what cannot be restored and change nothing.

1. The target state is a revision's stored snapshot (:mod:`.store`); the plan is
   :func:`envguard.restore.plan.plan_restore`'s, against the environment as it is now.
2. Each package to install or change needs its exact build: a direct URL the snapshot
   recorded (VCS commit, archive, folder) is used as restore uses it; an index install is
   looked for in uv's cache by its build fingerprint and zipped back into a wheel
   (:mod:`.builds`), else among the builds ``envguard install`` kept before replacing them
   (:mod:`.kept`: pip's, those uv's cache lacks), each file checked as it is zipped. Never
   "the same version" from an index: uv gets ``--no-index`` and only those wheels. A
   build found nowhere, or kept damaged, stops the undo before anything changes.
3. The plan is synced into a scratch copy of the environment's metadata
   (:func:`envguard.install.scratch.metadata_clone`) and the copy proven: its packages
   compared with the revision, the restored packages' files hashed against RECORD. Only a
   proven copy lets the same sync run on the environment itself, with Ctrl-C deferred
   until it is done (what it replaces that uv's cache lacks is kept first, as install
   keeps it); the environment is then proven (every file hashed against RECORD:
   :func:`envguard.restore.verify.proof_snapshot`) and the undo recorded as a revision.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from envguard.atomic import check_state_path
from envguard.errors import InputError
from envguard.frozen import frozen
from envguard.install.apply import deferred_signals
from envguard.install.predict import prefix_of, snapshot_options
from envguard.install.scratch import check_guard, scratch_copy, wait_for_removals
from envguard.probe import collect
from envguard.probe.options import locations_only
from envguard.restore.plan import (
    CHANGE,
    INSTALL,
    REMOVE,
    SKIP,
    IndexOptions,
    RestorePlan,
    plan_restore,
)
from envguard.restore.verify import Verification, verification_to_dict
from envguard.revisions.builds import find_in_uv_cache, wheel_from_archive
from envguard.revisions.keep import KeptBuild, keep_builds
from envguard.revisions.kept import find_kept, wheel_from_kept
from envguard.revisions.store import (
    Revision,
    env_folder,
    list_revisions,
    load_snapshot,
    state_of,
    state_root,
)
from envguard.runs.store import now_iso

Echo = Callable[[str], None]
UNDO_SCHEMA = "envguard.undo/1"


@frozen
class BuildSource:
    """Where the exact build of one package comes from."""

    name: str
    version: str | None
    source: str
    """``uv cache``, ``kept build``, ``vcs``, ``archive``, ``directory``, ``editable``, or
    ``not found``."""
    detail: str = ""


@frozen
class UndoReport:
    environment: str
    target: int
    plan: RestorePlan
    sources: tuple[BuildSource, ...]
    dry_run: bool = False
    scratch: Verification | None = None
    """The scratch copy's proof (the undo stops here when it fails)."""
    verification: Verification | None = None
    """The environment's proof, once changed."""
    revision: Revision | None = None
    kept: tuple[KeptBuild, ...] = ()
    """The builds the undo replaced or removed that uv's cache does not hold, kept first
    (:mod:`.keep`), so that a later ``undo --to N`` finds them too."""

    @property
    def missing(self) -> tuple[BuildSource, ...]:
        return tuple(s for s in self.sources if s.source == "not found")

    @property
    def applied(self) -> bool:
        return self.verification is not None

    @property
    def ok(self) -> bool:
        if self.missing:
            return False
        proof = self.verification or self.scratch
        return proof is None or proof.ok

    def to_dict(self) -> dict[str, Any]:
        from envguard.restore.plan import plan_to_dict

        return {"schema": UNDO_SCHEMA, "environment": self.environment, "target": self.target,
                "dry_run": self.dry_run, "ok": self.ok, "applied": self.applied,
                "plan": plan_to_dict(self.plan),
                "sources": [dataclasses.asdict(s) for s in self.sources],
                "missing": [s.name for s in self.missing],
                "scratch": verification_to_dict(self.scratch) if self.scratch else None,
                "verification": (verification_to_dict(self.verification)
                                 if self.verification else None),
                "revision": self.revision.number if self.revision else None,
                "kept": [dataclasses.asdict(k) for k in self.kept]}


def _sources(plan: RestorePlan, target: Any, wheels: Path,
             env: Mapping[str, str]) -> tuple[BuildSource, ...]:
    out = []
    for row in plan.rows:
        if row.action == SKIP:
            out.append(BuildSource(name=row.name, version=row.good_version,
                                   source="not found", detail=row.reason))
        if row.action not in (INSTALL, CHANGE):
            continue
        if row.source not in (None, "index"):
            out.append(BuildSource(name=row.name, version=row.good_version,
                                   source=row.source or "", detail=row.requirement or ""))
            continue
        dist = target.package(row.name)
        archive = find_in_uv_cache(dist, env) if dist is not None else None
        if archive is not None and dist is not None:
            wheel_from_archive(archive, dist, wheels)
            out.append(BuildSource(name=row.name, version=row.good_version,
                                   source="uv cache", detail=str(archive)))
            continue
        kept = find_kept(dist) if dist is not None else None
        made, why = (wheel_from_kept(dist, wheels) if dist is not None and kept is not None
                     and kept.folder else (None, kept.reason if kept else ""))
        if made is not None and kept is not None:
            out.append(BuildSource(name=row.name, version=row.good_version,
                                   source="kept build", detail=str(kept.folder)))
            continue
        out.append(BuildSource(
            name=row.name, version=row.good_version, source="not found",
            detail=why or "this build is not in uv's cache, nor kept by envguard (an index "
            "may serve another build under the same version: not used)"))
    return tuple(out)


def undo(python: str, *, to: int | None = None, dry_run: bool = False,
         env: Mapping[str, str] | None = None, echo: Echo | None = None,
         step: Echo | None = None) -> UndoReport:
    """Return the environment of ``python`` to revision ``to`` (default: the state before
    the last recorded change); see the module."""
    from envguard.restore.build import find_uv, sync_in_place
    from envguard.restore.verify import proof_snapshot, verify_restore
    from envguard.revisions.store import record_revision

    environ = os.environ if env is None else env
    current = collect(snapshot_options(python))
    prefix = str(prefix_of(current))
    revisions = list_revisions(prefix)
    if not revisions.revisions:
        raise InputError(f"no revisions recorded for {prefix}: envguard records the changes "
                         "made through envguard install, envguard undo and restore --in-place")
    last = revisions.revisions[-1]
    # default: the state before the last change (changes made without envguard since
    # are undone too); --to N: the state revision N left
    number = last.number - 1 if to is None else to
    target = load_snapshot(prefix, last.before if to is None else state_of(revisions, number))
    wheels = Path(tempfile.mkdtemp(prefix="envguard-undo-"))
    try:
        plan = plan_restore(target, current, good_name=f"revision {number}",
                            index=IndexOptions(no_index=True, find_links=(str(wheels),)))
        plan = dataclasses.replace(plan, index_hints=())  # builds come from uv's cache only
        report = UndoReport(environment=prefix, target=number, plan=plan, dry_run=dry_run,
                            sources=_sources(plan, target, wheels, environ))
        if report.missing or dry_run:
            return report
        # where the undo's revision goes, checked before anything changes
        check_state_path(env_folder(prefix) / "rev-000000.json", state_root())
        uv = find_uv()
        rel = os.path.relpath(os.path.abspath(python), os.path.abspath(
            current.interpreter.prefix))
        changed = frozenset(r.name for r in plan.rows if r.action in (INSTALL, CHANGE))
        with scratch_copy(Path(prefix), site_packages=current.interpreter.site_packages) as (
                folder, guard, _):
            scratch_python = str(folder / rel)
            sync_in_place(dataclasses.replace(plan, current_python=scratch_python), uv=uv,
                          echo=echo, step=step)
            check_guard(guard)
            # the copy holds the metadata of every package and the files of the restored
            # ones: those files are hashed against their RECORD
            proof = collect(dataclasses.replace(locations_only(scratch_python), verify="hash",
                                                integrity_only=changed))
            scratch = verify_restore(target, proof, good_name=f"revision {number}",
                                     new_name="a scratch copy")
        report = dataclasses.replace(report, scratch=scratch)
        if not scratch.ok:
            wait_for_removals()
            return report
        started = now_iso()
        try:
            kept = keep_builds((current.package(r.name) for r in plan.rows
                                if r.action in (CHANGE, REMOVE)), prefix=prefix, env=environ)
        except BaseException:
            wait_for_removals()  # the copy: never left half-removed
            raise
        with deferred_signals():
            sync_in_place(plan, uv=uv, echo=echo, step=step)
            proof = proof_snapshot(python)
            verification = verify_restore(target, proof, good_name=f"revision {number}",
                                          new_name=prefix)
            after = collect(snapshot_options(python))
            revision = record_revision(
                prefix, current, after, kind="undo", argv=("envguard", "undo", "--to",
                                                           str(number)),
                exit_code=0 if verification.ok else 1, started_at=started,
                note="" if verification.ok else "not restored exactly: " + "; ".join(
                    u.detail for u in verification.unreproduced))
            wait_for_removals()
        return dataclasses.replace(report, verification=verification, revision=revision,
                                   kept=kept)
    finally:
        shutil.rmtree(wheels, ignore_errors=True)
