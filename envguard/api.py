"""envguard's public Python API: snapshot, read, compare and gate from a training script.

Everything here is also reachable as ``envguard.NAME`` (:mod:`envguard` loads this module
on first use, so the command line never pays for it). It is typed, stable within the
snapshot schema's major version (``envguard.snapshot/1``), never prints, and never writes
into a compile cache. Errors are :class:`envguard.errors.EnvguardError` subclasses with a
one-line message (``InputError`` for bad input, ``ProbeError`` for an interpreter that
cannot be probed, ``OutputError`` for a result that cannot be written).

    import envguard

    snap = envguard.snapshot()                     # the environment this script runs in
    snap.write("runs/42/env.json")
    report = envguard.diff(envguard.read_snapshot("good.json"), snap)
    if not report.equivalent:
        print(report.to_markdown())
    gate = envguard.check("dflash-train")          # lockfiles/dflash-train.toml
    assert gate.passed, envguard.format_report(gate)

docs/API.md describes each function.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

from envguard.bisection.report import BisectReport
from envguard.changes import SnapshotDiff
from envguard.doctor import DoctorReport
from envguard.errors import InputError
from envguard.explain.interface import Finding
from envguard.explain.report import DiffReport
from envguard.frozen import frozen
from envguard.gate.check import GateResult
from envguard.install.predict import InstallPlan
from envguard.model import Snapshot
from envguard.revisions.undo import UndoReport

Verify = Literal["none", "size", "hash"]
Format = Literal["text", "json", "markdown"]

__all__ = ["BisectReport", "DoctorReport", "Format", "GateResult", "InstallPlan", "Report",
           "Snapshot", "UndoReport", "Verify", "bisect", "check", "diagnose", "diff",
           "format_report", "plan_install", "read_snapshot", "snapshot", "undo"]


def snapshot(python: str | os.PathLike[str] | None = None, *,
             files: Iterable[str] = (), verify: Verify = "size", deep: bool = False,
             cwd: str | os.PathLike[str] | None = None,
             env: Mapping[str, str] | None = None) -> Snapshot:
    """A snapshot of an environment, as ``envguard snapshot`` takes it.

    ``python``: an interpreter or an environment folder; None means this process's own
    interpreter (``sys.executable``), so a training script records the environment it runs
    in, whatever ``VIRTUAL_ENV`` says or whichever ``.venv`` its folder holds (the command
    line's discovery rule is for a shell; pass ``python=`` to look elsewhere). ``files``:
    globs whose content is hashed, relative to
    ``cwd``; ``[tool.envguard] files`` of the nearest pyproject.toml are added. ``verify``:
    how installed files are checked against RECORD. ``deep``: also import torch, in a
    child process. ``env``: the environment variables to record (default: this process's).
    """
    from envguard.probe import SnapshotOptions, collect
    from envguard.probe.discovery import discover, this_process

    if verify not in ("none", "size", "hash"):
        raise InputError(f"verify={verify!r}: expected 'none', 'size' or 'hash'")
    where = Path(cwd) if cwd is not None else Path.cwd()
    variables = os.environ if env is None else env
    selection = (discover(os.fspath(python), env=variables, cwd=where) if python is not None
                 else this_process())
    options = SnapshotOptions(python=selection.python, selected_by=selection.selected_by,
                              verify=verify,
                              deep=deep, file_patterns=tuple(files), cwd=where, env=env)
    return collect(options)


def read_snapshot(path: str | os.PathLike[str]) -> Snapshot:
    """A snapshot file written by ``envguard snapshot`` or :meth:`Snapshot.write`, checked
    against the schema (``InputError`` naming the file and field when it does not fit,
    ``UnsupportedSchemaError`` for a newer major). Credentials in an old file are masked."""
    from envguard.snapshot_file import read_snapshot as read

    return read(Path(path))


@frozen(kw_only=False)
class Report:
    """What :func:`diff` found: every change, and the findings that explain them, most
    likely cause first. Plain data; the ``to_*`` methods render it."""

    old: Snapshot
    new: Snapshot
    detail: DiffReport

    @property
    def findings(self) -> tuple[Finding, ...]:
        """Explained causes, most likely first (rule id, severity, evidence, remedy)."""
        return self.detail.findings

    @property
    def changes(self) -> SnapshotDiff:
        """Every difference, material or not."""
        return self.detail.diff

    @property
    def equivalent(self) -> bool:
        """No difference that changes behaviour (``envguard diff`` exits 0)."""
        return self.detail.equivalent

    @property
    def verdict(self) -> str:
        """The headline, one sentence."""
        return self.detail.verdict

    def to_text(self, *, width: int = 80, show_all: bool = False) -> str:
        return format_report(self, "text", width=width, show_all=show_all)

    def to_markdown(self, *, show_all: bool = False) -> str:
        return format_report(self, "markdown", show_all=show_all)

    def to_json(self) -> str:
        """The ``envguard.diff/1`` document (docs/DIFF.md), as ``--format json`` prints it."""
        return format_report(self, "json")

    def to_dict(self) -> dict[str, Any]:
        """:meth:`to_json` as a dict."""
        document: dict[str, Any] = json.loads(self.to_json())
        return document


def diff(old: Snapshot, new: Snapshot, *, symptom: str | None = None,
         old_name: str = "old", new_name: str = "new") -> Report:
    """Compare two snapshots and explain the differences. ``symptom``: an error line; the
    findings it points at come first. The names label the sides in the rendered report."""
    from envguard.changes import diff as compare
    from envguard.explain import explain, symptom_text

    symptom = symptom_text(symptom)
    changes = compare(old, new)
    findings = tuple(explain(old, new, changes, symptom))
    return Report(old=old, new=new, detail=DiffReport(
        old_name=old_name, new_name=new_name, diff=changes, findings=findings,
        symptom=symptom))


def check(lock: str | os.PathLike[str], *, python: str | os.PathLike[str] | None = None,
          cwd: str | os.PathLike[str] | None = None, strict: bool = False) -> GateResult:
    """Does an environment match a lock? ``lock`` is a lock name (``lockfiles/NAME.toml``
    in ``cwd`` or a parent, else the bundled one) or a path (it has a ``/`` or ends in
    ``.toml``). ``python`` as for :func:`snapshot`. ``GateResult.passed`` is the verdict,
    ``GateResult.findings`` the reasons; :func:`format_report` renders it."""
    from envguard.explain.tables import is_lock_path
    from envguard.gate.command import check_command
    from envguard.probe.discovery import discover, this_process

    where = Path(cwd) if cwd is not None else Path.cwd()
    text = os.fspath(lock)
    is_path = isinstance(lock, os.PathLike) or is_lock_path(text)
    name = Path(text).stem if is_path else text
    selection = (discover(os.fspath(python), env=os.environ, cwd=where) if python is not None
                 else this_process())
    path = where / text if is_path else None  # an absolute ``text`` replaces ``where``
    return check_command(name, lock=path, python=selection.python, cwd=where, strict=strict)


def diagnose(python: str | os.PathLike[str] | None = None, *, symptom: str | None = None,
           verify: Verify = "size", cwd: str | os.PathLike[str] | None = None,
           env: Mapping[str, str] | None = None) -> DoctorReport:
    """What ``envguard doctor`` finds in one environment, with no baseline:
    ``report.healthy``, ``report.findings`` (most likely trouble first; ``symptom``
    re-ranks them). ``python``, ``cwd``, ``env`` as for :func:`snapshot`; ``env`` is also
    what ``LD_LIBRARY_PATH``/``LD_PRELOAD`` are read from."""
    from envguard.doctor import diagnose as run_rules
    from envguard.doctor.facts import gather, snapshot_options
    from envguard.probe import collect
    from envguard.probe.discovery import discover, this_process

    where = Path(cwd) if cwd is not None else Path.cwd()
    variables = os.environ if env is None else env
    selection = (discover(os.fspath(python), env=variables, cwd=where) if python is not None
                 else this_process())
    snap = collect(snapshot_options(selection, verify=verify, cwd=where, env=env))
    return run_rules(gather(snap, env=variables, cwd=where),
                    environment=selection.describe(), symptom=symptom)


def bisect(good: Snapshot, bad: Snapshot, command: Iterable[str], *,
           python: str | os.PathLike[str] | None = None,
           find_links: Iterable[str | os.PathLike[str]] = (), index_url: str | None = None,
           no_index: bool = False, offline: bool = False, timeout: float | None = None,
           runs: int = 1, jobs: int = 1, keep: bool = False,
           workdir: str | os.PathLike[str] | None = None,
           cwd: str | os.PathLike[str] | None = None,
           env: Mapping[str, str] | None = None) -> BisectReport:
    """Which changes from ``good`` to ``bad`` make ``command`` fail, as ``envguard bisect``
    finds them (docs/BISECT.md): ``report.verdict`` (``found``, ``inconclusive``,
    ``refused``), ``report.culprits``, ``report.trials``. ``env``: the environment each
    trial's command starts from (default: this process's). RestoreError: uv failed."""
    from envguard.bisection.engine import BisectOptions
    from envguard.bisection.engine import bisect as search
    from envguard.restore.plan import IndexOptions, link_paths

    options = BisectOptions(
        command=tuple(command), python=os.fspath(python) if python is not None else None,
        index=IndexOptions(index_url=index_url, find_links=link_paths(find_links),
                           no_index=no_index, offline=offline), timeout=timeout,
        runs=runs, jobs=jobs, keep=keep,
        workdir=Path(workdir).absolute() if workdir is not None else None,
        env=dict(os.environ if env is None else env),
        cwd=os.fspath(cwd) if cwd is not None else os.getcwd())
    return search(good, bad, options, good_name="good", bad_name="bad")


def plan_install(argv: Iterable[str], python: str | os.PathLike[str] | None = None, *,
                 cwd: str | os.PathLike[str] | None = None,
                 env: Mapping[str, str] | None = None) -> InstallPlan:
    """What ``envguard install --dry-run -- ARGV`` predicts (docs/INSTALL.md): the installer
    command run on a scratch copy of the venv, nothing changed. ``plan.refused`` (a critical
    finding or a broken lock of ``cwd``'s ``lockfiles/``), ``plan.packages``,
    ``plan.findings``, ``plan.predicted`` (the snapshot after the change). ``python``: as
    for :func:`snapshot` (``None``: this interpreter's venv). InputError: not an installer
    command envguard guards, or not a venv; RestoreError: the command fails on the copy."""
    from envguard.install.command import parse_command
    from envguard.install.predict import predict
    from envguard.probe.discovery import discover, this_process
    from envguard.restore.build import find_uv

    where = Path(cwd) if cwd is not None else Path.cwd()
    words = list(argv)
    command = parse_command(words, uv=find_uv() if words[:1] == ["uv"] else None)
    selection = (discover(os.fspath(python), env=os.environ, cwd=where) if python is not None
                 else this_process())
    from envguard.install.scratch import wait_for_removals

    try:
        return predict(command, python=selection.executable, cwd=where, env=env)
    finally:
        wait_for_removals()


def undo(python: str | os.PathLike[str] | None = None, *, to: int | None = None,
         dry_run: bool = False, env: Mapping[str, str] | None = None) -> UndoReport:
    """What ``envguard undo`` does (docs/INSTALL.md): return the venv of ``python`` (as for
    :func:`snapshot`; ``None``: this interpreter's) to revision ``to`` (default: the state
    before the last recorded change), exactly to the build, proven on a scratch copy first.
    ``report.ok``, ``report.missing`` (builds found nowhere: nothing changed),
    ``report.verification``. ``env``: where uv's cache is found (default os.environ)."""
    from envguard.probe.discovery import discover, this_process
    from envguard.revisions.undo import undo as run_undo

    selection = (discover(os.fspath(python), env=os.environ, cwd=Path.cwd())
                 if python is not None else this_process())
    return run_undo(selection.executable, to=to, dry_run=dry_run, env=env)


def format_report(report: Report | GateResult | DoctorReport | BisectReport | InstallPlan
                  | UndoReport, fmt: Format = "text", *,
                  width: int = 80, show_all: bool = False) -> str:
    """A report as ``envguard diff``/``check``/``doctor``/``bisect``/``install``/``undo``
    print it with ``--format fmt`` (text without colour, ``width`` columns)."""
    from envguard.render import PlainScreen, render

    if fmt not in ("text", "json", "markdown"):
        raise InputError(f"format={fmt!r}: expected 'text', 'json' or 'markdown'")
    inner: Any = report.detail if isinstance(report, Report) else report
    if isinstance(report, InstallPlan):
        from envguard.install.report import InstallReport

        inner = InstallReport(plan=report)
    return render(inner, fmt, show_all=show_all, screen=PlainScreen(width=width))
