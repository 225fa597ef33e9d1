"""Running external commands (nvidia-smi, nvcc, git, interpreters) with a timeout.

Nothing here raises for an ordinary failure: a command that is missing, fails,
crashes or hangs comes back as a :class:`CommandResult` whose ``error`` says why
in one line, so a probe can record it and the snapshot still completes.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
from collections.abc import Mapping, Sequence

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


def start(
    args: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
) -> subprocess.Popen[bytes] | CommandResult:
    """The first half of :func:`run`: the command started (or why it could not be)."""
    argv = tuple(str(a) for a in args)
    if os.sep not in argv[0]:
        search = env.get("PATH") if env is not None else None
        found = shutil.which(argv[0], path=search)
        if found is None:
            return CommandResult(argv, None, "", "", f"{argv[0]}: not found on PATH")
        argv = (found, *argv[1:])
    try:
        return subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            env=dict(env) if env is not None else None,
            cwd=cwd,
            start_new_session=True,
        )
    except OSError as exc:
        return CommandResult(argv, None, "", "", f"{argv[0]}: {exc.strerror or exc}")


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
