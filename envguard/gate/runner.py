"""Running the guarded command: argv unchanged, no shell, signals forwarded, code passed on."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from types import FrameType

from envguard.errors import CommandNotFound
from envguard.frozen import frozen

_FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@frozen
class ChildExit:
    """How the child ended: ``returncode`` as :class:`subprocess.Popen` gives it (-N when
    signal N killed it)."""

    returncode: int

    @property
    def signal(self) -> int | None:
        return -self.returncode if self.returncode < 0 else None

    @property
    def signal_name(self) -> str | None:
        if self.signal is None:
            return None
        try:
            return signal.Signals(self.signal).name
        except ValueError:
            return f"signal {self.signal}"

    @property
    def status(self) -> int:
        """Shell-style: 128 + N when killed by signal N, else the exit code."""
        return 128 - self.returncode if self.returncode < 0 else self.returncode


def run_child(argv: Sequence[str], env: Mapping[str, str]) -> ChildExit:
    """Run ``argv`` and return how it ended (:attr:`ChildExit.status` is the shell's status).

    SIGTERM and SIGHUP received by envguard are passed to the child, which decides
    what to do with them; envguard waits for it either way. SIGINT is passed on too,
    except from a terminal: Ctrl-C already reaches the child, which shares envguard's
    foreground process group, and a second SIGINT could cut its clean-up short.
    """
    executable = resolve_command(argv[0], env)
    if executable is None:
        raise CommandNotFound(f"command not found: {argv[0]}")
    child: subprocess.Popen[bytes] | None = None
    pending: list[int] = []

    from_terminal = sys.stdin is not None and sys.stdin.isatty()

    def forward(signum: int, _frame: FrameType | None) -> None:
        if signum == signal.SIGINT and from_terminal:
            return  # the terminal delivered it to the child already
        if child is None:
            pending.append(signum)  # arrived while the child was being started
        elif child.poll() is None:
            child.send_signal(signum)

    # Installed before the child starts: a SIGTERM in between must not orphan it.
    previous = {s: signal.signal(s, forward) for s in _FORWARDED}
    try:
        try:
            child = subprocess.Popen(list(argv), executable=executable, env=dict(env))
        except FileNotFoundError:
            raise CommandNotFound(f"command not found: {argv[0]}") from None
        except PermissionError:
            raise CommandNotFound(f"command not executable: {argv[0]}") from None
        for signum in pending:
            child.send_signal(signum)
        while True:
            try:
                code = child.wait()
                break
            except KeyboardInterrupt:  # pragma: no cover - SIGINT is forwarded instead
                continue
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    return ChildExit(returncode=code)


def resolve_command(command: str, env: Mapping[str, str] | None = None) -> str | None:
    """``command`` on PATH, else next to envguard's own interpreter (its venv's bin)."""
    if os.sep in command:
        return command if os.access(command, os.X_OK) else None
    path = (env or os.environ).get("PATH")
    return shutil.which(command, path=path) or shutil.which(
        command, path=os.path.dirname(sys.executable))
