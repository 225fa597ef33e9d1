"""Make the predicted change in the real environment, once its prediction was accepted, and
check the result against the prediction; record the change as a revision.

A uv command's prediction holds the installer's files (``plan.staged``): they are moved into
place (:mod:`envguard.install.transplant`), so the installer runs once and what is installed
is the very build the prediction judged. Otherwise (pip, a prediction made on a whole copy,
a move that could not be made) the installer runs again, in the environment.

The installer runs in its own session, so a Ctrl-C at the terminal reaches envguard only:
envguard lets the installer finish (an installer stopped half-way leaves a half-installed
environment that no revision describes), records the change, and then reports the
interruption (exit 130); ``envguard undo`` returns to the state before it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import subprocess
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

from envguard.atomic import check_state_path
from envguard.frozen import frozen
from envguard.install.command import InstallerCommand, installer_environment
from envguard.install.predict import InstallPlan, differences, snapshot_options
from envguard.install.scratch import wait_for_removals
from envguard.install.transplant import discard, transplant
from envguard.install.uninstalls import TransplantFailed
from envguard.model import Distribution
from envguard.probe import collect
from envguard.revisions.keep import KeptBuild, keep_builds
from envguard.revisions.store import Revision, env_folder, record_revision, state_root
from envguard.runs.store import now_iso

Echo = Callable[[str], None]
REPLACED = ("remove", "change", "rebuild")
"""The prediction's actions that take an installed build away."""


@frozen
class Applied:
    """The command's run in the real environment, and how its result compares."""

    exit_code: int
    differences: tuple[str, ...]
    """Where the environment now differs from the prediction (empty: as predicted)."""
    revision: Revision | None
    """None when nothing changed (no revision recorded)."""
    interrupted: bool = False
    kept: tuple[KeptBuild, ...] = ()
    """The builds the command replaces or removes that uv's cache does not hold, kept for
    ``envguard undo`` before it ran (:mod:`envguard.revisions.keep`), or why not."""
    moved: bool = False
    """The predicted files were moved into place; False: the installer ran again."""
    why_run: str = ""
    """Why a staged prediction's files were not moved (the installer ran instead)."""


def run_to_end(argv: list[str], *, env: Mapping[str, str], cwd: str,
               echo: Echo | None) -> int:
    """Run ``argv`` in its own session to its end, passing each output line to ``echo``;
    its exit status."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, text=True, errors="replace",
                            start_new_session=True, env=dict(env), cwd=cwd)
    with proc:
        assert proc.stdout is not None  # noqa: S101 - set by stdout=PIPE
        for line in proc.stdout:
            if echo is not None:
                echo(line.rstrip("\n"))
        return proc.wait()


@contextlib.contextmanager
def deferred_signals() -> Iterator[list[int]]:
    """SIGINT, SIGTERM and SIGHUP noted, not raised, while the block runs."""
    got: list[int] = []

    def note(signum: int, frame: object) -> None:
        got.append(signum)

    previous = {}
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        with contextlib.suppress(ValueError):  # not the main thread: nothing to defer
            previous[sig] = signal.signal(sig, note)
    try:
        yield got
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def read_back(plan: InstallPlan) -> bool:
    """Whether the environment holds what the plan predicted for every package it
    changes: each new build's RECORD fingerprint read back from the environment (unless
    it is the very file the prediction read: the same inode, size and modification time
    as in the copy, :attr:`~envguard.install.transplant.Staged.records`), each removed
    distribution's metadata folder gone."""
    from envguard.probe.recordfile import fingerprint_record, fingerprinted_rows

    def folder(dist: Distribution) -> str:
        return os.path.join(dist.location, dist.metadata_dir)

    read = plan.staged.records if plan.staged is not None else {}
    for change in plan.packages:
        new, old = plan.predicted.package(change.name), plan.before.package(change.name)
        if old is not None and (new is None or folder(old) != folder(new)) and os.path.lexists(
                folder(old)):
            return False
        if new is None:
            continue
        record = os.path.join(folder(new), "RECORD")
        try:
            st = os.lstat(record)
        except OSError:
            return False
        if read.get(record) == (st.st_ino, st.st_size, st.st_mtime_ns):
            continue
        rows = fingerprinted_rows(record)
        if not rows or fingerprint_record(rows) != new.fingerprint:
            return False
    return True


def apply_install(plan: InstallPlan, command: InstallerCommand, *, cwd: Path,
                  env: Mapping[str, str] | None = None, echo: Echo | None = None) -> Applied:
    """Run ``command`` against ``plan``'s environment, snapshot it, compare with the
    prediction and record the revision (when anything changed)."""
    started = now_iso()
    # where its revision goes, checked before anything changes: a planted link refuses
    check_state_path(env_folder(plan.environment) / "rev-000000.json", state_root())
    given = os.environ if env is None else env
    environ = installer_environment(given)
    try:  # before the installer: what it replaces or removes, kept where uv's cache lacks it
        kept = keep_builds((plan.before.package(p.name) for p in plan.packages
                            if p.action in REPLACED), prefix=plan.environment, env=given)
    except BaseException:
        discard(plan.staged)
        wait_for_removals()  # the prediction's copy: never left half-removed
        raise
    with deferred_signals() as got:
        moved, why = False, ""
        if plan.staged is not None:
            try:
                transplant(plan.staged, echo=echo)
                moved = True
                started = plan.staged.started_at or started  # the files were written then
            except TransplantFailed as exc:
                why = str(exc)
            finally:
                discard(plan.staged)
        code = 0 if moved else run_to_end(command.argv_for(plan.python), env=environ,
                                          cwd=str(cwd), echo=echo)
        if moved and read_back(plan):
            # moved under envguard's and uv's locks, every changed distribution read back
            after = dataclasses.replace(plan.predicted, created_at=now_iso())
            found: tuple[str, ...] = ()
        else:
            patterns = tuple(dict.fromkeys(f.pattern for f in plan.before.files.files))
            after = collect(snapshot_options(plan.python, patterns))
            found = differences(plan.predicted, after) if code == 0 else ()
        note = ("differs from the prediction: " + "; ".join(found)) if found else ""
        revision = (record_revision(plan.environment, plan.before, after, kind="install",
                                    argv=command.argv, exit_code=code, started_at=started,
                                    note=note) if differences(plan.before, after) else None)
        wait_for_removals(detached=False)  # the prediction's copy, removed meanwhile
    return Applied(exit_code=code, differences=found, revision=revision,
                   interrupted=bool(got), kept=kept, moved=moved, why_run=why)
