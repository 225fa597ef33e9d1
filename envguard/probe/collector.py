"""Collect a snapshot: every probe, run once, slow external commands in parallel.

``collect(options)`` is the entry point; ``collect_packages`` takes a snapshot's
distributions and torch build alone (``envguard install``'s scratch copy, whose system,
caches and variables are the environment's own). Neither imports torch in this process;
``--deep`` imports it in a crash-isolated subprocess.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Mapping
from pathlib import Path

from envguard.errors import InputError
from envguard.frozen import frozen
from envguard.model import (
    SCHEMA,
    CondaPackage,
    Distribution,
    Integrity,
    Interpreter,
    Options,
    ProbeIssue,
    Snapshot,
    TorchIdentity,
)
from envguard.paths import memo_dir
from envguard.probe import (
    caches,
    conda,
    deep,
    distributions,
    envvars,
    files,
    integrity,
    system,
    torch_identity,
)
from envguard.probe.background import Task
from envguard.probe.commands import CommandResult, guard, release, run
from envguard.probe.fastpath import gpu as gpu_memo
from envguard.probe.fastpath import statahead
from envguard.probe.fastpath.hashes import HashMemo
from envguard.probe.fastpath.records import BorrowedMemo, RecordMemo
from envguard.probe.interpreter import Target, interpreter_section, probe_python, probe_self
from envguard.probe.options import SnapshotOptions
from envguard.probe.progress import NullProgress, Progress
from envguard.redact import redact_data, redact_snapshot
from envguard.version import __version__

COMMAND_TIMEOUT_S = 20.0


def _project_config(options: SnapshotOptions, issues: list[ProbeIssue]) -> tuple[list[str],
                                                                                 list[str]]:
    """(file patterns, extra env patterns) from ``[tool.envguard]``."""
    if not options.use_project_config:
        return [], []
    pyproject = files.find_pyproject(options.cwd)
    if pyproject is None:
        return [], []
    try:
        patterns, env = files.project_config(pyproject)
        return (patterns if options.project_files else []), env
    except InputError as exc:
        issues.append(ProbeIssue(section="files", message=str(exc), path=str(pyproject)))
        return [], []


GIT = ("git", "-c", "safe.bareRepository=explicit", "-c", "core.fsmonitor=false",
       "--no-optional-locks")
"""git as the probe runs it in a folder it did not make: a repository may carry a bare
repository as plain files (``HEAD``, ``objects/``, a ``config`` whose ``core.fsmonitor``
is a command ``git status`` runs), so one is used only when ``GIT_DIR`` names it; no
fsmonitor hook runs, and the index is not rewritten (no ``post-index-change`` hook)."""


@frozen(kw_only=False, slots=False)
class _Commands:
    """External commands started first, so they overlap with the file work."""

    gpus: Task[tuple[CommandResult, str | None]]
    nvcc: Task[CommandResult] | None
    git_root: Task[CommandResult] | None
    git_status: Task[CommandResult] | None

    @classmethod
    def start(cls, env: Mapping[str, str], cwd: str, memo_root: Path,
              git: bool = True) -> _Commands:
        nvcc_cmd = system.nvcc_command(env)
        git = git and files.may_be_in_git_repo(cwd, env)
        git_status = [*GIT, "status", "--porcelain=v2", "--branch", "-z"]
        return cls(
            gpus=Task(lambda: gpu_memo.query(env, COMMAND_TIMEOUT_S, memo_root)),
            nvcc=Task(lambda: run(nvcc_cmd, timeout=COMMAND_TIMEOUT_S)) if nvcc_cmd else None,
            git_root=Task(lambda: run([*GIT, "rev-parse", "--show-toplevel"], cwd=cwd,
                                      env=env, timeout=COMMAND_TIMEOUT_S)) if git else None,
            git_status=Task(lambda: run(git_status, cwd=cwd, env=env,
                                        timeout=COMMAND_TIMEOUT_S)) if git else None,
        )


def _target(options: SnapshotOptions, memo_root: Path) -> Target:
    """The interpreter's facts: probed (from the memo unless ``use_memo`` is off), or this
    process's own."""
    return (probe_python(options.python, memo_root if options.use_memo else None)
            if options.python else probe_self())


def _with_compat_key(torch: TorchIdentity, installed: list[distributions.InstalledDist],
                     gpu_names: list[str]) -> TorchIdentity:
    torch_item = next((i for i in installed if i.dist.name == "torch"), None)
    return dataclasses.replace(torch, compat_key=torch_identity.compat_key(
        torch, torch_item, gpu_names))


def _scan(target: Target, options: SnapshotOptions, memo_root: Path,
          issues: list[ProbeIssue]) -> tuple[list[distributions.InstalledDist],
                                             statahead.Ahead | None]:
    """The distributions, and the stat work started ahead on the records memo's rows (by
    the command, or here: it then overlaps with the scan only)."""
    prefix = str(target.facts.get("prefix") or "")
    ahead = None
    if options.use_memo:
        if options.verify == "size" and options.integrity_only is None:
            statahead.start(prefix, memo_root)
        ahead = statahead.take(prefix, memo_root)
    records = (ahead.memo if ahead is not None else RecordMemo.for_prefix(prefix, memo_root)
               if options.use_memo else None)
    if records is None and options.memo_of is not None:
        records = BorrowedMemo(options.memo_of, prefix, memo_root)
    installed, scan_issues = distributions.scan(target.sys_path, records)
    issues.extend(scan_issues)
    if records is not None:
        for note in (records.load_error, records.save()):
            if note:
                issues.append(ProbeIssue(section="packages", message=note))
    return installed, ahead


def _begin_verify(installed: list[distributions.InstalledDist], target: Target,
                  options: SnapshotOptions, memo_root: Path, ahead: statahead.Ahead | None,
                  issues: list[ProbeIssue]) -> integrity.PendingCheck:
    memo = None
    if options.verify == "hash":
        memo = HashMemo.for_prefix(str(target.facts.get("prefix") or ""), memo_root)
        if memo.load_error:
            issues.append(ProbeIssue(section="integrity", message=memo.load_error))
    scope = installed if options.integrity_only is None else [
        i for i in installed if i.dist.name in options.integrity_only]
    return integrity.begin(scope, options.verify, memo=memo, ahead=ahead)


def _finish_verify(pending: integrity.PendingCheck, progress: Progress | None,
                   issues: list[ProbeIssue]) -> Integrity:
    checked = pending.finish(progress or NullProgress())
    if pending.memo is not None and (error := pending.memo.save()):
        issues.append(ProbeIssue(section="integrity", message=f"hash memo not saved: {error}"))
    return checked


def collect(options: SnapshotOptions, progress: Progress | None = None) -> Snapshot:
    """Snapshot the target environment. Raises only if the interpreter cannot be probed."""
    started = time.perf_counter()
    now_ns = time.time_ns()  # as datetime's "%Y-%m-%dT%H:%M:%S.%fZ", without importing it
    created = (time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now_ns // 10**9))
               + f".{now_ns // 1000 % 10**6:06d}Z")
    env = options.env if options.env is not None else os.environ
    issues: list[ProbeIssue] = []
    timings: dict[str, float] = {}
    mark = started

    def lap(phase: str) -> None:
        nonlocal mark
        now = time.perf_counter()
        timings[phase] = round((now - mark) * 1000, 1)
        mark = now

    memo_root = options.memo_root or memo_dir()
    target = _target(options, memo_root)
    lap("interpreter")

    installed, ahead = _scan(target, options, memo_root, issues)
    torch, torch_issues = torch_identity.probe(installed, target.sys_path)
    issues.extend(torch_issues)
    lap("packages")
    # The RECORD check may fork (integrity.PendingCheck), so it begins before any thread:
    # the external commands and --deep start right after, and overlap with its work.
    pending = _begin_verify(installed, target, options, memo_root, ahead, issues)
    guard()  # the commands start in threads: a SIGTERM kills them too (deep's torch import)
    commands = _Commands.start(env, str(options.cwd), memo_root, options.git)
    deep_task = Task(lambda: deep.collect(target.executable)) if options.deep else None
    checked = _finish_verify(pending, progress, issues)
    if any(i.links for i in checked.issues):  # an edited file with other links: uv's cache?
        from envguard.probe.hardlinks import mark_shared

        checked = mark_shared(checked, pending.installed, env)
    conda_packages, checked = _conda(Path(str(target.facts.get("prefix") or "")), installed,
                                     checked, options.verify, issues)
    lap("integrity")

    project_files, extra_env = _project_config(options, issues)
    user_patterns = [str(options.cwd / p) for p in options.file_patterns]
    git_root = commands.git_root.result() if commands.git_root else None
    git_status = commands.git_status.result() if commands.git_status else None
    tracked = files.collect([*user_patterns, *project_files],
                            git_root if git_root is not None and git_root.ok else None,
                            git_status, issues)
    environment = envvars.collect(env, extra_env, issues)
    lap("files")
    progress = progress or NullProgress()
    if not commands.gpus.done():
        progress.step(f"waiting for nvidia-smi (at most {COMMAND_TIMEOUT_S:g} s)")
    smi_result, cuda_driver = commands.gpus.result()
    progress.finish()
    lap("gpu_wait")
    sysinfo = system.collect(env, target.facts.get("glibc"), smi_result,
                             commands.nvcc.result() if commands.nvcc else None, issues,
                             cuda_driver)
    torch = _with_compat_key(torch, installed, [g.name for g in sysinfo.gpus])
    cache_dirs, cache_issues = caches.probe(env, target.facts, torch,
                                            remember=options.remember_caches,
                                            state_root=options.memo_root)
    issues.extend(cache_issues)
    lap("caches")
    if deep_task is not None and not deep_task.done():
        progress.step(f"importing torch in {target.executable} (--deep, at most "
                      f"{deep.DEEP_TIMEOUT_S:g} s)")
    deep_section = deep_task.result() if deep_task else None
    release()
    progress.finish()
    if deep_section is not None and not deep_section.ok:
        issues.append(ProbeIssue(section="deep", message=deep_section.error or "failed"))
    lap("deep_wait")

    # The model boundary: no string of the user's environment leaves unredacted.
    return redact_snapshot(Snapshot(
        schema=SCHEMA,
        envguard_version=__version__,
        created_at=created,
        duration_s=round(time.perf_counter() - started, 3),
        options=Options(verify=options.verify, deep=options.deep, python=options.python,
                        file_patterns=list(options.file_patterns)),
        interpreter=interpreter_section(target, options.selected_by),
        torch=torch,
        packages=[i.dist for i in installed],
        integrity=checked,
        caches=cache_dirs,
        files=tracked,
        system=sysinfo,
        environment=environment,
        deep=deep_section,
        conda=conda_packages,
        errors=sorted(issues, key=_issue_key),
        timings_ms=timings,
    ))


@frozen
class Packages:
    """A snapshot's interpreter, distributions and torch build, without the rest."""

    interpreter: Interpreter
    packages: list[Distribution]
    torch: TorchIdentity


def collect_packages(options: SnapshotOptions, gpu_names: list[str]) -> Packages:
    """The interpreter, distributions and torch build :func:`collect` would record, redacted
    alike; ``gpu_names``: the GPUs torch's compatibility key is made for (those of the
    system the environment runs on). No RECORD check, no command is run."""
    memo_root = options.memo_root or memo_dir()
    target = _target(options, memo_root)
    installed, _ = _scan(target, options, memo_root, [])
    torch, _ = torch_identity.probe(installed, target.sys_path)
    torch = _with_compat_key(torch, installed, gpu_names)
    return redact_data(Packages(interpreter=interpreter_section(target, options.selected_by),
                                packages=[i.dist for i in installed], torch=torch))


def _conda(prefix: Path, installed: list[distributions.InstalledDist], checked: Integrity,
           mode: str,
           issues: list[ProbeIssue]) -> tuple[list[CondaPackage], Integrity]:
    """The prefix's conda packages (none without ``conda-meta/``), their files checked
    under the same ``--verify`` mode as the Python distributions'."""
    if not prefix.parts or not (prefix / "conda-meta").is_dir():
        return [], checked
    records = conda.read_records(prefix, issues)
    found = conda.verify(prefix, records, mode)
    packages = conda.with_python_dists([r[0] for r in records], (i.dist for i in installed))
    checked = dataclasses.replace(
        checked, issues=[*checked.issues, *found.issues],
        checked_files=checked.checked_files + found.files,
        checked_bytes=checked.checked_bytes + found.size,
        hashed_bytes=checked.hashed_bytes + found.hashed,
        tolerated=checked.tolerated + found.tolerated)
    return sorted(packages, key=lambda p: p.name), checked


def _issue_key(issue: ProbeIssue) -> tuple[str, str, str]:
    return (issue.section, issue.path or "", issue.message)
