"""Collect a snapshot: every probe, run once, slow external commands in parallel.

``collect(options)`` is the only entry point. It never imports torch in this
process; ``--deep`` imports it in a crash-isolated subprocess.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from envguard import __version__
from envguard.errors import InputError
from envguard.model import SCHEMA, Interpreter, Options, ProbeIssue, Snapshot
from envguard.probe import (
    caches,
    deep,
    distributions,
    envvars,
    files,
    gpu_cache,
    integrity,
    system,
    torch_identity,
)
from envguard.probe.commands import CommandResult, run
from envguard.probe.hashcache import HashCache, default_cache_root
from envguard.probe.interpreter import Target, probe_python, probe_self
from envguard.probe.recordcache import RecordCache
from envguard.progress import NullProgress, Progress

__all__ = ["SnapshotOptions", "collect"]

COMMAND_TIMEOUT_S = 20.0


@dataclass(frozen=True, kw_only=True)
class SnapshotOptions:
    python: str | None = None
    """Another interpreter (or venv folder) to snapshot; None for envguard's own."""
    verify: str = "size"
    deep: bool = False
    file_patterns: tuple[str, ...] = ()
    cwd: Path = field(default_factory=Path.cwd)
    use_project_config: bool = True
    """Read ``[tool.envguard]`` from the nearest pyproject.toml."""
    write_cache_marker: bool = True
    env: Mapping[str, str] | None = None
    hash_cache_root: Path | None = None
    """Folder of envguard's private caches (hashes, parsed RECORDs, GPU facts)."""
    use_caches: bool = True
    """Reuse parsed RECORDs from earlier snapshots of the same environment."""


def _abi_tag(soabi: str | None, interpreter_tag: str) -> str | None:
    if not soabi:
        return None
    parts = soabi.split("-")
    if parts[0] == "cpython" and len(parts) > 1:
        return "cp" + parts[1]
    return "_".join(parts[:2]) if len(parts) > 1 else interpreter_tag


def interpreter_section(target: Target) -> Interpreter:
    f = target.facts
    interp_tag = str(f.get("interpreter_tag") or "")
    abi = _abi_tag(f.get("soabi"), interp_tag)
    plat = str(f.get("platform") or "")
    machine = plat.split("-", 1)[-1].replace("-", "_").replace(".", "_")
    glibc = str(f.get("glibc") or "")
    if plat.startswith("linux") and glibc.startswith("glibc "):
        major, _, minor = glibc.split()[1].partition(".")
        plat_tag = f"manylinux_{major}_{minor.split('.')[0]}_{machine}"
    else:
        plat_tag = plat.replace("-", "_").replace(".", "_")
    best = f"{interp_tag}-{abi}-{plat_tag}" if abi else None
    return Interpreter(
        executable=str(f.get("executable") or ""),
        version=str(f.get("version") or ""),
        implementation=str(f.get("implementation") or ""),
        prefix=str(f.get("prefix") or ""),
        base_prefix=str(f.get("base_prefix") or ""),
        is_venv=bool(f.get("is_venv")),
        site_packages=[str(p) for p in f.get("site_packages") or []],
        sys_path=target.sys_path,
        interpreter_tag=interp_tag,
        abi_tag=abi,
        platform=plat,
        best_tag=best,
    )


def _project_config(options: SnapshotOptions, issues: list[ProbeIssue]) -> tuple[list[str],
                                                                                 list[str]]:
    """(file patterns, extra env patterns) from ``[tool.envguard]``."""
    if not options.use_project_config:
        return [], []
    pyproject = files.find_pyproject(options.cwd)
    if pyproject is None:
        return [], []
    try:
        return files.project_config(pyproject)
    except InputError as exc:
        issues.append(ProbeIssue(section="files", message=str(exc), path=str(pyproject)))
        return [], []


def collect(options: SnapshotOptions, progress: Progress | None = None) -> Snapshot:
    """Snapshot the target environment. Raises only if the interpreter cannot be probed."""
    started = time.perf_counter()
    created = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    env = options.env if options.env is not None else os.environ
    issues: list[ProbeIssue] = []
    cwd = str(options.cwd)
    timings: dict[str, float] = {}
    cache_root = options.hash_cache_root or default_cache_root()
    mark = time.perf_counter()

    def lap(phase: str) -> None:
        nonlocal mark
        now = time.perf_counter()
        timings[phase] = round((now - mark) * 1000, 1)
        mark = now

    with ThreadPoolExecutor(max_workers=5) as pool:
        # Slow external commands first, so they overlap with the interpreter probe.
        smi: Future[tuple[CommandResult, str | None]] = pool.submit(
            gpu_cache.query, env, COMMAND_TIMEOUT_S, cache_root)
        nvcc_cmd = system.nvcc_command(env)
        nvcc = pool.submit(run, nvcc_cmd, timeout=COMMAND_TIMEOUT_S) if nvcc_cmd else None
        git_root = pool.submit(run, ["git", "rev-parse", "--show-toplevel"], cwd=cwd,
                               env=env, timeout=COMMAND_TIMEOUT_S)
        git_status = pool.submit(run, ["git", "status", "--porcelain=v2", "--branch", "-z"],
                                 cwd=cwd, env=env, timeout=COMMAND_TIMEOUT_S)
        target = probe_python(options.python) if options.python else probe_self()
        lap("interpreter")
        deep_result = pool.submit(deep.collect, target.executable) if options.deep else None

        prefix = str(target.facts.get("prefix") or "")
        records = RecordCache.for_prefix(prefix, cache_root) if options.use_caches else None
        installed, scan_issues = distributions.scan(target.sys_path, records)
        issues.extend(scan_issues)
        if records is not None:
            for note in (records.load_error, records.save()):
                if note:
                    issues.append(ProbeIssue(section="packages", message=note))
        torch, torch_issues = torch_identity.probe(installed, target.sys_path)
        issues.extend(torch_issues)
        lap("packages")

        cache = None
        if options.verify == "hash":
            cache = HashCache.for_prefix(prefix, cache_root)
            if cache.load_error:
                issues.append(ProbeIssue(section="integrity", message=cache.load_error))
        checked = integrity.verify(installed, options.verify, cache=cache, progress=progress
                                   or NullProgress())
        if cache is not None and (error := cache.save()):
            issues.append(ProbeIssue(section="integrity", message=f"hash cache not saved: {error}"))
        lap("integrity")

        project_files, extra_env = _project_config(options, issues)
        user_patterns = [str(options.cwd / p) for p in options.file_patterns]
        git_root_result = git_root.result()
        tracked = files.collect([*user_patterns, *project_files],
                                git_root_result if git_root_result.ok else None,
                                git_status.result(), issues)
        lap("files")
        environment = envvars.collect(env, extra_env, issues)
        smi_result, cuda_driver = smi.result()
        lap("gpu_wait")
        sysinfo = system.collect(env, target.facts.get("glibc"), smi_result,
                                 nvcc.result() if nvcc else None, issues, cuda_driver)
        torch_item = next((i for i in installed if i.dist.name == "torch"), None)
        torch = dataclasses.replace(torch, compat_key=torch_identity.compat_key(
            torch, torch_item, [g.name for g in sysinfo.gpus]))
        cache_dirs, cache_issues = caches.probe(env, target.facts, torch,
                                                write_marker=options.write_cache_marker)
        issues.extend(cache_issues)
        lap("caches")
        deep_section = deep_result.result() if deep_result else None
        lap("deep_wait")
    if deep_section is not None and not deep_section.ok:
        issues.append(ProbeIssue(section="deep", message=deep_section.error or "failed"))

    opts = Options(verify=options.verify, deep=options.deep, python=options.python,
                   file_patterns=list(options.file_patterns))
    return Snapshot(
        schema=SCHEMA,
        envguard_version=__version__,
        created_at=created,
        duration_s=round(time.perf_counter() - started, 3),
        options=opts,
        interpreter=interpreter_section(target),
        torch=torch,
        packages=[i.dist for i in installed],
        integrity=checked,
        caches=cache_dirs,
        files=tracked,
        system=sysinfo,
        environment=environment,
        deep=deep_section,
        errors=sorted(issues, key=_issue_key),
        timings_ms=timings,
    )


def _issue_key(issue: ProbeIssue) -> tuple[str, str, str]:
    return (issue.section, issue.path or "", issue.message)
