"""Running the guarded command: argv unchanged, no shell, signals forwarded, code passed on."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from types import FrameType
from typing import Any

from envguard.atomic import write_text_atomic
from envguard.errors import CommandNotFound
from envguard.model import Snapshot
from envguard.paths import RUNS_DIR
from envguard.redact import redact_argv

LAST_GOOD = "last-good.json"
_FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def run_child(argv: Sequence[str], env: Mapping[str, str]) -> int:
    """Run ``argv`` and return its exit status, shell-style (128 + N when killed by signal N).

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
    return 128 - code if code < 0 else code


def resolve_command(command: str, env: Mapping[str, str] | None = None) -> str | None:
    """``command`` on PATH, else next to envguard's own interpreter (its venv's bin)."""
    if os.sep in command:
        return command if os.access(command, os.X_OK) else None
    path = (env or os.environ).get("PATH")
    return shutil.which(command, path=path) or shutil.which(
        command, path=os.path.dirname(sys.executable))


def record_run(snapshot: Snapshot, meta: dict[str, Any], cwd: Path, *, good: bool) -> Path:
    """Keep the verified snapshot (and ``last-good.json`` when it passed) for a later diff.

    The record's ``argv`` is redacted (``--token X`` is kept as ``--token ***``); every file
    is written 0600."""
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S%fZ")
    folder = cwd / RUNS_DIR
    name = str(meta.get("lock", "run")).replace(os.sep, "_")
    path = write_text_atomic(folder / f"{stamp}-{name}.json", snapshot.to_json(), mode=0o600)
    record = {**meta, "snapshot": path.name}
    if "argv" in record:
        record["argv"] = redact_argv(record["argv"])
    write_text_atomic(folder / f"{stamp}-{name}.run.json",
                      json.dumps(record, indent=2, sort_keys=True) + "\n", mode=0o600)
    if good:
        write_text_atomic(folder / LAST_GOOD, snapshot.to_json(), mode=0o600)
    return path
