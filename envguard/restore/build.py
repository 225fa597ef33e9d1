"""Build a restore plan with uv.

:func:`build_venv` creates ``PATH.partial-<pid>`` with ``uv venv --relocatable``, fills
it with ``uv pip sync`` (exactly the plan's set), then renames it to ``PATH``; on any
failure, timeout or Ctrl-C the partial folder is removed and ``PATH`` never appears.
:func:`sync_in_place` is the ``--in-place`` variant. Proving the result is
:mod:`envguard.restore.verify`'s job.

No printing: uv's output lines go to a callback the CLI supplies.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path

from envguard.errors import RestoreError
from envguard.explain.remedies import check_name, field_key, uv_pip_sync, uv_pip_uninstall, uv_venv
from envguard.frozen import frozen
from envguard.restore.plan import CHANGE, REMOVE, SEED_PACKAGES, RestorePlan

UV_VENV_TIMEOUT_S = 600.0
UV_SYNC_TIMEOUT_S = 3600.0
"""compat_key also hashes the GPU names: a property of the host, not of the packages."""
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")

Echo = Callable[[str], None]


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


@frozen(kw_only=False)
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
    """Run uv (:func:`run_process`); a uv that cannot be started is a RestoreError."""
    try:
        return run_process(args, timeout=timeout, echo=echo)
    except OSError as exc:
        raise RestoreError(f"cannot run {args[0]}: {exc.strerror or exc}") from None


def run_process(args: list[str], *, timeout: float | None, echo: Echo | None = None,
                env: dict[str, str] | None = None, cwd: str | None = None,
                tail_lines: int = 40) -> UvResult:
    """Run ``args`` in its own process group, stdout and stderr together, passing each output
    line to ``echo`` and keeping the last ``tail_lines``. A timeout (None: none) or an
    exception here (Ctrl-C) kills the process and everything it started. OSError: it could
    not be started."""
    proc = _start(args, env=env, cwd=cwd)
    return _follow(proc, timeout=timeout, echo=echo, tail_lines=tail_lines)


class Running:
    """A process started now (:func:`run_process`'s rules), its output read in a
    :class:`~envguard.probe.background.Task`.

    The process exists when the constructor returns, so :meth:`kill` from the caller's
    thread always reaches it: an interruption right after the start cannot miss it, as a
    start inside a background thread could. OSError: it could not be started."""

    def __init__(self, args: list[str], *, timeout: float | None,
                 echo: Echo | None = None, env: dict[str, str] | None = None,
                 cwd: str | None = None) -> None:
        from envguard.probe.background import Task

        self._proc = _start(args, env=env, cwd=cwd)
        try:
            self._task = Task(functools.partial(_follow, self._proc, timeout=timeout,
                                                echo=echo))
        except BaseException:  # Ctrl-C in between: the caller never gets it to kill
            _kill(self._proc)
            raise

    def kill(self) -> None:
        """Kill the process and all it started; :meth:`result` then returns at once."""
        _kill(self._proc)

    def result(self) -> UvResult:
        return self._task.result()


def _start(args: list[str], *, env: dict[str, str] | None,
           cwd: str | None) -> subprocess.Popen[str]:
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, text=True, errors="replace",
                            start_new_session=True, env=env, cwd=cwd)
    with _LIVE_LOCK:
        _LIVE.add(proc)
    return proc


def _follow(proc: subprocess.Popen[str], *, timeout: float | None, echo: Echo | None,
            tail_lines: int = 40) -> UvResult:
    tail: deque[str] = deque(maxlen=tail_lines)
    expired = threading.Event()

    def expire() -> None:
        expired.set()
        _kill(proc)

    timer = threading.Timer(timeout, expire) if timeout is not None else None
    if timer is not None:
        timer.daemon = True
        timer.start()
    with proc:  # closes the pipe and reaps the process however this block is left
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
            if timer is not None:
                timer.cancel()
            with _LIVE_LOCK:
                _LIVE.discard(proc)
    return UvResult(proc.returncode, tuple(tail), expired.is_set())


_LIVE: set[subprocess.Popen[str]] = set()
_LIVE_LOCK = threading.Lock()


def kill_running() -> None:
    """Kill every process :func:`run_process` started that is still running, with all it
    started (parallel trials, when the main thread is interrupted)."""
    with _LIVE_LOCK:
        live = list(_LIVE)
    for proc in live:
        _kill(proc)


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


@contextlib.contextmanager
def _requirements_file(plan: RestorePlan) -> Iterator[Path]:
    """The plan's requirements in a temporary file, removed afterwards."""
    workdir = Path(tempfile.mkdtemp(prefix="envguard-restore-"))
    try:
        reqs = workdir / "requirements.txt"
        reqs.write_text(sync_requirements(plan), encoding="utf-8")
        yield reqs
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def build_venv(plan: RestorePlan, target: Path, *, uv: str, python: str,
               echo: Echo | None = None, step: Echo | None = None,
               python_is_path: bool = False) -> Path:
    """Create ``target`` holding exactly the plan's package set; returns its interpreter.
    ``python``: an ``X.Y`` spec, or (``python_is_path``) the interpreter of the
    environment the user selected."""
    tmp = partial_path(target)
    if tmp.exists():
        raise RestoreError(f"{tmp} already exists (left by an interrupted run?); remove it")
    with _requirements_file(plan) as reqs:
        _build(plan, tmp, target, reqs, uv=uv, python=python, echo=echo, step=step,
               python_is_path=python_is_path)
    return target / "bin" / "python"


def _build(plan: RestorePlan, tmp: Path, target: Path, reqs: Path, *, uv: str, python: str,
           echo: Echo | None, step: Echo | None, python_is_path: bool) -> None:
    """Fill ``tmp`` with uv, then rename it to ``target``; on any failure ``tmp`` is removed."""
    # uv names the folder it works in ("Activate with: source TMP/bin/activate", absolute or
    # relative to the working directory); the user gets TARGET, its sibling, where the venv
    # will be once it is complete.
    shown = None if echo is None else _renaming(echo, tmp.name, target.name)
    try:
        fill_venv(tmp, reqs, uv=uv, python=python, venv_args=plan.uv_network_args(),
                  sync_args=plan.uv_index_args(), label=str(target), echo=shown, step=step,
                  python_is_path=python_is_path)
        try:
            os.rename(tmp, target)
        except OSError as exc:
            raise RestoreError(f"cannot move {tmp} to {target}: {exc.strerror or exc}") from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def fill_venv(path: Path, requirements: Path, *, uv: str, python: str, venv_args: list[str],
              sync_args: list[str], label: str | None = None, echo: Echo | None = None,
              step: Echo | None = None, venv_timeout: float = UV_VENV_TIMEOUT_S,
              sync_timeout: float = UV_SYNC_TIMEOUT_S, python_is_path: bool = False) -> None:
    """``uv venv --relocatable`` at ``path``, then ``uv pip sync`` it to exactly the lines of
    ``requirements``; a RestoreError names the step that failed and uv's own error line.
    ``venv_args`` go to both steps (``--offline``), ``sync_args`` to the sync (indexes).
    ``python`` is an ``X.Y[.Z]`` spec (checked: UnsafeValue, exit 2), or an absolute
    interpreter path the user chose when ``python_is_path``."""
    argv = uv_venv(python, str(path), uv=uv, user_path=python_is_path,
                   options=["--color", "never", "--relocatable", *venv_args])
    if step:
        step(f"creating a venv with Python {python} for {label or path}")
    _check(run_uv(argv, timeout=venv_timeout, echo=echo), "creating the venv", venv_timeout)
    if step:
        count = sum(1 for ln in requirements.read_text(encoding="utf-8").splitlines() if ln)
        step(f"installing {count} package(s) with uv pip sync")
    _check(run_uv(uv_pip_sync(str(requirements), uv=uv, python=str(path / "bin" / "python"),
                              options=["--color", "never", "--allow-empty-requirements",
                                       *sync_args]), timeout=sync_timeout, echo=echo),
           "installing the packages", sync_timeout)


def _renaming(echo: Echo, old: str, new: str) -> Echo:
    def shown(line: str) -> None:
        echo(line.replace(old, new))

    return shown


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
    with _requirements_file(plan) as reqs:
        if step:
            step(f"syncing {python} to {len(plan.requirements)} package(s) with uv pip sync")
        reinstall = [f"--reinstall-package={check_name(name, f'packages.{field_key(name)}.name')}"
                     for name in rebuilt]
        _check(run_uv(uv_pip_sync(str(reqs), uv=uv, python=python, options=[
                   "--color", "never", "--allow-empty-requirements", *plan.uv_index_args(),
                   *reinstall]), timeout=UV_SYNC_TIMEOUT_S, echo=echo),
               "syncing the environment", UV_SYNC_TIMEOUT_S)
        if seeds:
            _check(run_uv(uv_pip_uninstall(seeds, uv=uv, python=python, options=[
                           "--color", "never", *plan.uv_network_args()]),
                          timeout=UV_VENV_TIMEOUT_S, echo=echo),
                   "removing " + " ".join(seeds), UV_VENV_TIMEOUT_S)
