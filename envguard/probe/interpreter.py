"""Which interpreter is snapshotted, and its facts (``_inprocess.collect``).

For envguard's own interpreter the facts are gathered in this process. For
``--python PATH`` the stdlib-only ``_inprocess.py`` runs in a subprocess of that
interpreter; envguard never imports the target's packages.
"""

from __future__ import annotations

import ast
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from envguard.errors import ProbeError
from envguard.probe import _inprocess
from envguard.probe.commands import run

PROBE_TIMEOUT_S = 30.0


@dataclass(frozen=True, slots=True)
class Target:
    """The interpreter being snapshotted and its raw facts."""

    facts: dict[str, Any]

    @property
    def sys_path(self) -> list[str]:
        return [str(p) for p in self.facts.get("sys_path", [])]

    @property
    def executable(self) -> str:
        return str(self.facts.get("executable") or "")


def resolve_python(python: str) -> str:
    """Accept an interpreter, a venv folder or a conda env folder; return the interpreter."""
    path = Path(python).expanduser()
    if path.is_dir():
        for candidate in ("bin/python", "bin/python3", "Scripts/python.exe", "python.exe"):
            if (path / candidate).exists():
                return str(path / candidate)
        raise ProbeError(f"no Python interpreter found in folder {path}")
    if not path.exists():
        found = None if os.sep in python else shutil.which(python)
        if found is None:
            raise ProbeError(f"interpreter not found: {python}")
        return found
    return str(path)


def probe_self() -> Target:
    return Target(facts=_inprocess.collect(drop_first_path=True))


def _venv_prefix(exe: str) -> str | None:
    """The venv folder an interpreter path belongs to (``pyvenv.cfg`` one level up)."""
    folder = os.path.dirname(os.path.dirname(os.path.abspath(exe)))
    return folder if os.path.isfile(os.path.join(folder, "pyvenv.cfg")) else None


def is_current_interpreter(exe: str) -> bool:
    """Whether ``exe`` is this very interpreter *and* environment.

    A venv's ``python`` is a symlink to the base interpreter, so the resolved paths
    of two venvs are equal: the venv folders must match too.
    """
    here = sys.executable
    if os.path.abspath(exe) == os.path.abspath(here):
        return True
    try:
        same_binary = os.path.samefile(exe, here)
    except OSError:
        return False
    prefix = _venv_prefix(exe)
    return same_binary and os.path.abspath(prefix or sys.base_prefix) == os.path.abspath(
        sys.prefix)


def probe_python(python: str) -> Target:
    """Run the stdlib-only probe under ``python``; raise ProbeError if it cannot run.

    When ``python`` is the interpreter envguard runs in, the facts are gathered in
    this process instead: a second interpreter start costs 10-80 ms.
    """
    exe = resolve_python(python)
    if is_current_interpreter(exe):
        return probe_self()
    script = Path(_inprocess.__file__)
    result = run([exe, str(script)], timeout=PROBE_TIMEOUT_S)
    if not result.ok:
        raise ProbeError(f"cannot probe {exe}: {result.error}")
    try:
        facts = ast.literal_eval(result.stdout.strip().splitlines()[-1])
    except (ValueError, SyntaxError, IndexError, MemoryError, RecursionError):
        raise ProbeError(f"cannot probe {exe}: it printed no facts") from None
    if not isinstance(facts, dict) or "sys_path" not in facts:
        raise ProbeError(f"cannot probe {exe}: unexpected probe output")
    return Target(facts=facts)
