"""Running external commands (nvidia-smi, nvcc, git, interpreters) with a timeout.

Nothing here raises for an ordinary failure: a command that is missing, fails,
crashes or hangs comes back as a :class:`CommandResult` whose ``error`` says why
in one line, so a probe can record it and the snapshot still completes.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import subprocess
import threading
from collections.abc import Mapping, Sequence
from types import FrameType
from typing import Any

from envguard.frozen import frozen


@frozen(kw_only=False)
class CommandResult:
    args: tuple[str, ...]
    returncode: int | None
    stdout: str
    stderr: str
    error: str | None
    """None on success; otherwise a one-line reason (missing, timeout, signal, exit status)."""

    @property
    def ok(self) -> bool:
        return self.error is None


def describe_returncode(code: int) -> str:
    """``exit status 3`` or ``killed by SIGSEGV``."""
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit status {code}"


def run(
    args: Sequence[str],
    *,
    timeout: float,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
) -> CommandResult:
    """Run ``args``; never raises for a missing, failing, crashing or hanging command.

    The command is looked up on ``env``'s PATH when ``env`` is given. It runs in its own
    process group, so a timeout kills everything it started (torch may spawn workers).
    """
    return finish(start(args, env=env, cwd=cwd), timeout=timeout)


_LIVE: dict[int, subprocess.Popen[bytes]] = {}
"""Commands :func:`start` started that nobody has reaped yet, by process (and group) id."""
_GUARDED = tuple(getattr(signal, n) for n in ("SIGTERM", "SIGHUP", "SIGINT")
                 if hasattr(signal, n))
_REPLACED: dict[int, Any] = {}
"""The handler :func:`guard` replaced, per signal: the one it passes the signal on to."""


def _kill_live() -> None:
    for pid in list(_LIVE):
        with contextlib.suppress(OSError):
            os.killpg(pid, signal.SIGKILL)


def _on_signal(signum: int, frame: FrameType | None) -> None:
    """Kill every command still running (each in its own process group: a probe blocked on a
    FIFO, torch's workers), then act as the handler it replaced: SIGTERM's default ends
    the process, SIGINT's raises KeyboardInterrupt."""
    _kill_live()
    previous = _REPLACED.get(signum, signal.SIG_DFL)
    _restore()
    if callable(previous):
        previous(signum, frame)
    elif previous == signal.SIG_DFL:
        signal.signal(signum, signal.SIG_DFL)
        signal.raise_signal(signum)


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def guard() -> None:
    """While commands :func:`start` started run, SIGTERM, SIGHUP and SIGINT kill their
    process groups before doing what they did before (a command runs in a session of its
    own, so a signal to envguard alone never reaches it). Handlers can only be set in the
    main thread: :func:`start` calls this there, and a caller that starts commands from
    other threads calls it first. Undone by :func:`release` once none runs."""
    if not _main_thread():
        return
    for sig in _GUARDED:
        with contextlib.suppress(ValueError, OSError):
            current = signal.getsignal(sig)
            if current is _on_signal or current is None or current == signal.SIG_IGN:
                continue
            _REPLACED[sig] = current
            signal.signal(sig, _on_signal)


def release() -> None:
    """Put back the handlers :func:`guard` replaced, once no command runs (main thread
    only; elsewhere they stay, and still pass each signal on)."""
    if not _LIVE and _main_thread():
        _restore()


def _restore() -> None:
    for sig, previous in _REPLACED.items():
        with contextlib.suppress(ValueError, OSError):
            if signal.getsignal(sig) is _on_signal:
                signal.signal(sig, previous)


@atexit.register
def _kill_at_exit() -> None:
    """At exit (after an exception, a KeyboardInterrupt): no command outlives envguard."""
    _kill_live()


def start(
    args: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
) -> subprocess.Popen[bytes] | CommandResult:
    """The first half of :func:`run`: the command started (or why it could not be), in a
    session of its own, killed with its group on SIGTERM, SIGHUP, SIGINT (:func:`guard`)
    and at exit."""
    argv = tuple(str(a) for a in args)
    if os.sep not in argv[0]:
        search = env.get("PATH") if env is not None else None
        found = shutil.which(argv[0], path=search)
        if found is None:
            return CommandResult(argv, None, "", "", f"{argv[0]}: not found on PATH")
        argv = (found, *argv[1:])
    guard()  # before the child exists: a signal in between must not orphan it
    try:
        proc = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            env=dict(env) if env is not None else None,
            cwd=cwd,
            start_new_session=True,
        )
    except OSError as exc:
        release()
        return CommandResult(argv, None, "", "", f"{argv[0]}: {exc.strerror or exc}")
    _LIVE[proc.pid] = proc
    return proc


def _reaped(proc: subprocess.Popen[bytes]) -> None:
    _LIVE.pop(proc.pid, None)
    release()


def finish(proc: subprocess.Popen[bytes] | CommandResult, *, timeout: float) -> CommandResult:
    """The second half of :func:`run`: wait at most ``timeout`` seconds for a command
    :func:`start` started, and read what it printed."""
    if isinstance(proc, CommandResult):
        return proc
    argv = tuple(str(a) for a in proc.args)  # type: ignore[union-attr]
    try:
        raw_out, raw_err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        stop(proc)
        return CommandResult(argv, None, "", "",
                             f"{os.path.basename(argv[0])}: timed out after {timeout:g} s")
    except BaseException:
        stop(proc)
        raise
    _reaped(proc)
    out = raw_out.decode("utf-8", "replace")
    err = raw_err.decode("utf-8", "replace")
    if proc.returncode != 0:
        last = next((ln.strip() for ln in reversed(err.splitlines()) if ln.strip()), "")
        reason = f"{os.path.basename(argv[0])}: {describe_returncode(proc.returncode)}"
        if last:
            reason += f": {last[:300]}"
        return CommandResult(argv, proc.returncode, out, err, reason)
    return CommandResult(argv, proc.returncode, out, err, None)


def stop(proc: subprocess.Popen[bytes]) -> None:
    """Kill a command :func:`start` started, with its process group, and reap it."""
    with contextlib.suppress(OSError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(OSError):
        proc.kill()
    proc.communicate()
    _reaped(proc)
