"""Running external commands (nvidia-smi, nvcc, git, interpreters) with a timeout.

Nothing here raises for an ordinary failure: a command that is missing, fails,
crashes or hangs comes back as a :class:`CommandResult` whose ``error`` says why
in one line, so a probe can record it and the snapshot still completes.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
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
    """Run ``args``; never raises for a missing, failing, crashing or hanging command."""
    argv = tuple(str(a) for a in args)
    if os.sep not in argv[0] and shutil.which(argv[0]) is None:
        return CommandResult(argv, None, "", "", f"{argv[0]}: not found on PATH")
    try:
        proc = subprocess.run(
            argv,
            capture_output=True,
            timeout=timeout,
            env=dict(env) if env is not None else None,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return CommandResult(argv, None, "", "", f"{argv[0]}: timed out after {timeout:g} s")
    except OSError as exc:
        return CommandResult(argv, None, "", "", f"{argv[0]}: {exc.strerror or exc}")
    out = proc.stdout.decode("utf-8", "replace")
    err = proc.stderr.decode("utf-8", "replace")
    if proc.returncode != 0:
        last = next((ln.strip() for ln in reversed(err.splitlines()) if ln.strip()), "")
        reason = f"{os.path.basename(argv[0])}: {describe_returncode(proc.returncode)}"
        if last:
            reason += f": {last[:300]}"
        return CommandResult(argv, proc.returncode, out, err, reason)
    return CommandResult(argv, proc.returncode, out, err, None)
