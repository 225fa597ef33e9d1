"""Build a restore plan with uv, and prove the result against GOOD.

:func:`build_venv` creates ``PATH.partial-<pid>`` with ``uv venv --relocatable``, fills
it with ``uv pip sync`` (exactly the plan's set), then renames it to ``PATH``; on any
failure, timeout or Ctrl-C the partial folder is removed and ``PATH`` never appears.
:func:`sync_in_place` is the ``--in-place`` variant. :func:`verify_restore` compares
GOOD with a snapshot of the result, looking only at packages (and the torch build that
they determine), never at paths, host, caches or environment variables.

No printing: uv's output lines go to a callback the CLI supplies.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from envguard.diff import ADDED, REMOVED, Change, diff
from envguard.errors import EnvguardError
from envguard.exitcodes import ExitCode
from envguard.explain import Finding, explain
from envguard.model import Snapshot
from envguard.restore import CHANGE, REMOVE, SEED_PACKAGES, RestorePlan

UV_VENV_TIMEOUT_S = 600.0
UV_SYNC_TIMEOUT_S = 3600.0
_IGNORED_TORCH_FIELDS = frozenset({"compat_key", "location"})
"""compat_key also hashes the GPU names: a property of the host, not of the packages."""
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")

Echo = Callable[[str], None]


class RestoreError(EnvguardError):
    """uv is missing, or failed, timed out or was stopped while building (exit 4)."""

    exit_code = ExitCode.ENVIRONMENT_ERROR


def find_uv() -> str:
    """The uv binary: the ``uv`` package's own first (envguard depends on it), then PATH."""
    try:
        from uv import find_uv_bin

        return str(find_uv_bin())
    except (ImportError, FileNotFoundError):
        pass
    found = shutil.which("uv")
    if found is None:
        raise RestoreError("uv not found: install it (pip install uv) or put it on PATH")
    return found


@dataclass(frozen=True, slots=True)
class UvResult:
    returncode: int | None
    lines: tuple[str, ...]
    """The last lines uv wrote (stdout and stderr together)."""
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out


def error_line(lines: tuple[str, ...]) -> str:
    """What went wrong, in one line, from uv's output.

    uv writes ``error: <what>`` followed by ``cause:`` lines (newer) or ``× <what>`` and
    ``╰─▶ <why>`` (older); the last error and its causes are joined.
    """
    text = [_ANSI.sub("", ln).strip() for ln in lines if ln.strip()]
    starts = [i for i, ln in enumerate(text) if ln.startswith(("error:", "×"))]
    if not starts:
        return text[-1] if text else "no output"
    head = text[starts[-1]].lstrip("× ").strip()
    causes = [ln.split(":", 1)[1].strip() if ln.startswith("cause:") else ln.lstrip("╰─▶ ")
              for ln in text[starts[-1] + 1:] if ln.startswith(("cause:", "╰─▶"))]
    return ": ".join([head, *causes])


def run_uv(args: list[str], *, timeout: float, echo: Echo | None = None) -> UvResult:
    """Run uv in its own process group, passing each output line to ``echo``.

    A timeout or an exception here (Ctrl-C) kills uv and everything it started.
    """
    tail: deque[str] = deque(maxlen=40)
    try:
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, text=True, errors="replace",
                                start_new_session=True)
    except OSError as exc:
        raise RestoreError(f"cannot run {args[0]}: {exc.strerror or exc}") from None
    expired = threading.Event()

    def expire() -> None:
        expired.set()
        _kill(proc)

    timer = threading.Timer(timeout, expire)
    timer.daemon = True
    timer.start()
    with proc:  # closes the pipe and reaps uv however this block is left
        try:
            assert proc.stdout is not None  # noqa: S101 - set by stdout=PIPE
            for line in proc.stdout:
                tail.append(line.rstrip("\n"))
                if echo is not None:
                    echo(line.rstrip("\n"))
            proc.wait()
        except BaseException:
            _kill(proc)
            raise
        finally:
            timer.cancel()
    return UvResult(proc.returncode, tuple(tail), expired.is_set())


def _kill(proc: subprocess.Popen[str]) -> None:
    with contextlib.suppress(OSError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(OSError):
        proc.kill()
    with contextlib.suppress(Exception):
        proc.wait(timeout=10)


def _check(result: UvResult, what: str, timeout: float) -> None:
    if result.timed_out:
        raise RestoreError(f"{what}: uv timed out after {timeout:g} s")
    if not result.ok:
        raise RestoreError(f"{what}: uv exit status {result.returncode}: "
                           f"{error_line(result.lines)}")


def partial_path(target: Path) -> Path:
    return target.with_name(f"{target.name}.partial-{os.getpid()}")


def sync_requirements(plan: RestorePlan) -> str:
    """The file given to ``uv pip sync``: requirement lines only (indexes are arguments)."""
    return "".join(f"{line}\n" for line in plan.requirements)


def build_venv(plan: RestorePlan, target: Path, *, uv: str, python: str,
               echo: Echo | None = None, step: Echo | None = None) -> Path:
    """Create ``target`` holding exactly the plan's package set; returns its interpreter."""
    tmp = partial_path(target)
    if tmp.exists():
        raise RestoreError(f"{tmp} already exists (left by an interrupted run?); remove it")
    workdir = Path(tempfile.mkdtemp(prefix="envguard-restore-"))
    try:
        reqs = workdir / "requirements.txt"
        reqs.write_text(sync_requirements(plan), encoding="utf-8")
        if step:
            step(f"creating a venv with Python {python} in {tmp}")
        _check(run_uv([uv, "venv", "--color", "never", "--relocatable", "--python", python,
                       str(tmp)], timeout=UV_VENV_TIMEOUT_S, echo=echo),
               "creating the venv", UV_VENV_TIMEOUT_S)
        if step:
            step(f"installing {len(plan.requirements)} package(s) with uv pip sync")
        _check(run_uv([uv, "pip", "sync", "--color", "never", "--python",
                       str(tmp / "bin" / "python"), "--allow-empty-requirements",
                       *plan.uv_index_args(), str(reqs)],
                      timeout=UV_SYNC_TIMEOUT_S, echo=echo),
               "installing the packages", UV_SYNC_TIMEOUT_S)
        try:
            os.rename(tmp, target)
        except OSError as exc:
            raise RestoreError(f"cannot move {tmp} to {target}: {exc.strerror or exc}") from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return target / "bin" / "python"


def sync_in_place(plan: RestorePlan, *, uv: str, echo: Echo | None = None,
                  step: Echo | None = None) -> None:
    """``uv pip sync`` the current environment to the plan (``--in-place``).

    Same-version rebuilds are reinstalled (``--reinstall-package``); pip, setuptools
    and wheel, which ``uv pip sync`` keeps, are uninstalled when GOOD lacks them.
    """
    python = plan.current_python
    rebuilt = [r.name for r in plan.rows
               if r.action == CHANGE and r.good_version == r.current_version]
    seeds = [r.name for r in plan.rows if r.action == REMOVE and r.name in SEED_PACKAGES]
    workdir = Path(tempfile.mkdtemp(prefix="envguard-restore-"))
    try:
        reqs = workdir / "requirements.txt"
        reqs.write_text(sync_requirements(plan), encoding="utf-8")
        if step:
            step(f"syncing {python} to {len(plan.requirements)} package(s) with uv pip sync")
        reinstall = [arg for name in rebuilt for arg in ("--reinstall-package", name)]
        _check(run_uv([uv, "pip", "sync", "--color", "never", "--python", python,
                       "--allow-empty-requirements", *plan.uv_index_args(), *reinstall,
                       str(reqs)], timeout=UV_SYNC_TIMEOUT_S, echo=echo),
               "syncing the environment", UV_SYNC_TIMEOUT_S)
        if seeds:
            _check(run_uv([uv, "pip", "uninstall", "--color", "never", "--python", python,
                           *seeds], timeout=UV_VENV_TIMEOUT_S, echo=echo),
                   "removing " + " ".join(seeds), UV_VENV_TIMEOUT_S)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


@dataclass(frozen=True, kw_only=True, slots=True)
class Unreproduced:
    name: str
    problem: str
    """``missing``, ``extra``, ``version``, ``build``, ``source``, ``editable`` or ``other``."""
    good: str | None
    new: str | None
    detail: str
    rule: str | None = None
    """The diff rule whose finding has the evidence (``torch-build-changed``)."""


@dataclass(frozen=True, kw_only=True, slots=True)
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


def verify_restore(good: Snapshot, new: Snapshot, *, good_name: str,
                   new_name: str) -> Verification:
    """What of GOOD's package set the restored environment does not reproduce."""
    changes = diff(good, new)
    packages = [c for c in changes.material if c.section == "packages"]
    torch = [c for c in changes.material
             if c.section == "torch" and c.key not in _IGNORED_TORCH_FIELDS]
    items = [_unreproduced(c, good, good_name) for c in packages]
    if torch and not any(c.key == "torch" for c in packages):
        items += [Unreproduced(name="torch", problem="other", good=_text(c.old),
                               new=_text(c.new), detail=f"torch {c.key}: {c.old} → {c.new}")
                  for c in torch]
    counted = packages + torch
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
