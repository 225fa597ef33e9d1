"""One trial: build a configuration's venv with uv, run the command in it, judge the outcome.

The venv is made in the bisection's work folder (``uv venv`` + ``uv pip sync``, exactly the
configuration's requirement lines), checked with ``uv pip check`` (a set whose dependencies
do not fit together, unless GOOD or BAD already had that problem, is *skipped*: it cannot
say anything), and the command runs there ``runs`` times with the venv first on ``PATH``
and ``VIRTUAL_ENV`` set. Exit status 0 passes, 125 skips (as ``git bisect run``), anything
else fails, and so does a timeout. The trial fails when any run fails.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Sequence
from pathlib import Path

from envguard.bisection.search import FAIL, PASS, SKIP
from envguard.errors import RestoreError
from envguard.frozen import frozen
from envguard.restore.build import fill_venv, run_process, run_uv

SKIP_STATUS = 125
"""The command's own "cannot test this one" (``git bisect run``'s convention)."""
TAIL_LINES = 20
UV_CHECK_TIMEOUT_S = 300.0


@frozen
class Run:
    status: int | None
    """The exit status; None when it timed out (killed) or could not start."""
    outcome: str
    seconds: float
    timed_out: bool = False


@frozen
class Trial:
    """One configuration tried: what was applied, how it went, what the command said."""

    number: int
    applied: tuple[str, ...]
    """The ids of the changes applied to GOOD (``()``: GOOD itself)."""
    outcome: str
    runs: tuple[Run, ...] = ()
    reason: str = ""
    """Why a trial was skipped, or how it failed, in one line."""
    tail: tuple[str, ...] = ()
    """The last lines the command wrote (its last failing run, else its last run)."""
    build_seconds: float = 0.0
    run_seconds: float = 0.0
    venv: str | None = None
    """Where its venv is (with ``--keep``); None once removed."""

    @property
    def mixed(self) -> bool:
        """Some runs passed and some failed: the command is flaky in this set."""
        outcomes = {r.outcome for r in self.runs}
        return PASS in outcomes and FAIL in outcomes

    @property
    def failed_runs(self) -> int:
        return sum(1 for r in self.runs if r.outcome == FAIL)


@frozen
class TrialSettings:
    uv: str
    python: str
    command: tuple[str, ...]
    venv_args: tuple[str, ...] = ()
    """For ``uv venv`` and ``uv pip check`` (``--offline``)."""
    sync_args: tuple[str, ...] = ()
    """For ``uv pip sync``: indexes, ``--find-links``, ``--offline``."""
    timeout: float | None = None
    runs: int = 1
    cwd: str | None = None
    keep: bool = False
    python_is_path: bool = False
    """``python`` is an interpreter path the user named (else an ``X.Y`` spec)."""


@frozen
class Built:
    """A built trial venv, or why it could not be built (then ``python`` is None)."""

    folder: Path
    python: Path | None
    seconds: float
    problem: str = ""
    check: frozenset[str] = frozenset()
    """``uv pip check``'s complaints about the set (empty: consistent)."""


def build(settings: TrialSettings, folder: Path, requirements: Sequence[str]) -> Built:
    """``folder`` filled with exactly ``requirements``; uv's error line when it fails."""
    started = time.perf_counter()
    folder.mkdir(parents=True)
    reqs = folder.with_name(folder.name + ".requirements.txt")
    reqs.write_text("".join(f"{line}\n" for line in requirements), encoding="utf-8")
    venv = folder / "venv"
    try:
        fill_venv(venv, reqs, uv=settings.uv, python=settings.python,
                  venv_args=list(settings.venv_args), sync_args=list(settings.sync_args),
                  python_is_path=settings.python_is_path)
    except RestoreError as exc:
        return Built(folder=folder, python=None, seconds=time.perf_counter() - started,
                     problem=str(exc))
    python = venv / "bin" / "python"
    checked = run_uv([settings.uv, "pip", "check", "--color", "never", "--python", str(python),
                      *settings.venv_args], timeout=UV_CHECK_TIMEOUT_S)
    complaints = frozenset() if checked.ok else check_conflicts(checked.lines, venv)
    return Built(folder=folder, python=python, seconds=time.perf_counter() - started,
                 check=complaints)


_CHECK_STATUS = ("Using Python", "Using CPython", "Using PyPy", "Checked", "Found", "Resolved",
                 "Audited", "warning:")
"""Lines of ``uv pip check`` that report what it did, not a conflict."""


def check_conflicts(lines: Sequence[str], venv: Path) -> frozenset[str]:
    """The conflicts among ``uv pip check``'s lines for the trial venv ``venv``: its status
    lines dropped (``Using Python 3.11.7 environment at: <venv>``, ``Checked 12 packages``),
    and so is any line naming the trial's own folder, which is new in every trial and
    would make every trial's set look newly inconsistent."""
    folder = str(venv)
    return frozenset(ln.strip() for ln in lines
                     if ln.strip() and not ln.strip().startswith(_CHECK_STATUS)
                     and folder not in ln)


def judge(status: int | None, timed_out: bool) -> str:
    if timed_out:
        return FAIL
    if status == 0:
        return PASS
    return SKIP if status == SKIP_STATUS else FAIL


def run_command(settings: TrialSettings, venv: Path, env: dict[str, str]
                ) -> tuple[tuple[Run, ...], tuple[str, ...], float]:
    """The command, ``settings.runs`` times, in ``venv`` with ``env``: the runs, the tail of
    the last failing run's output (else the last run's), and the time they took."""
    env = dict(env)
    env["VIRTUAL_ENV"] = str(venv)
    env["PATH"] = os.pathsep.join([str(venv / "bin"), env.get("PATH", "")])
    for name in ("PYTHONHOME", "CONDA_PREFIX", "__PYVENV_LAUNCHER__"):
        env.pop(name, None)
    runs: list[Run] = []
    tail: tuple[str, ...] = ()
    failing_tail: tuple[str, ...] | None = None
    started = time.perf_counter()
    for _ in range(max(1, settings.runs)):
        t0 = time.perf_counter()
        try:
            result = run_process(list(settings.command), timeout=settings.timeout, env=env,
                                 cwd=settings.cwd, tail_lines=TAIL_LINES)
            status, timed_out, lines = result.returncode, result.timed_out, result.lines
        except OSError as exc:
            status, timed_out = 127, False
            lines = (f"cannot run {settings.command[0]}: {exc.strerror or exc}",)
        if timed_out:
            lines = (*lines, f"(timed out after {settings.timeout:g} s and was killed)")
        outcome = judge(status, timed_out)
        runs.append(Run(status=None if timed_out else status, outcome=outcome,
                        seconds=time.perf_counter() - t0, timed_out=timed_out))
        tail = lines
        if outcome == FAIL:
            failing_tail = lines
    return tuple(runs), failing_tail or tail, time.perf_counter() - started


def overall(runs: Sequence[Run]) -> str:
    """Fails if any run failed; skipped if every run skipped; passes otherwise."""
    outcomes = {r.outcome for r in runs}
    if FAIL in outcomes:
        return FAIL
    return SKIP if outcomes == {SKIP} else PASS


def describe_failure(runs: Sequence[Run]) -> str:
    failed = [r for r in runs if r.outcome == FAIL]
    if not failed:
        return ""
    last = failed[-1]
    how = "timed out" if last.timed_out else f"exit status {last.status}"
    return how if len(runs) == 1 else f"{len(failed)} of {len(runs)} runs failed ({how})"


def remove(folder: Path) -> None:
    shutil.rmtree(folder, ignore_errors=True)
    folder.with_name(folder.name + ".requirements.txt").unlink(missing_ok=True)
