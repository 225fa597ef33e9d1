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
from envguard.model import Interpreter
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


# ---------------------------------------------------------------------------- the section

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
