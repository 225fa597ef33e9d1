"""Which interpreter is snapshotted, and its facts (``_inprocess.collect``).

For envguard's own interpreter the facts are gathered in this process. For
``--python PATH`` the stdlib-only ``_inprocess.py`` runs in a subprocess of that
interpreter; envguard never imports the target's packages.
"""

from __future__ import annotations

import ast
import atexit
import contextlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from envguard.errors import ProbeError
from envguard.frozen import frozen
from envguard.paths import memo_dir
from envguard.probe import _inprocess
from envguard.probe.commands import CommandResult, finish, start, stop
from envguard.probe.fastpath import facts as facts_memo

if TYPE_CHECKING:
    from envguard.model import Interpreter

PROBE_TIMEOUT_S = 30.0


@frozen(kw_only=False)
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
    """The absolute path of the interpreter ``python`` names.

    ``python`` may be an interpreter, a venv folder or a conda env folder. A value with a
    slash (``./python``, ``~/envs/a``) is a path, relative to the working directory; a bare
    name is a folder of the working directory if there is one (``.venv``), else a command
    looked up on PATH, as a shell would.
    """
    expanded = os.path.expanduser(python)
    if not _has_slash(expanded) and not os.path.isdir(expanded):
        found = shutil.which(expanded)
        if found is None:
            hint = (f" (for the file in the current folder write ./{python})"
                    if os.path.isfile(expanded) else "")
            raise ProbeError(f"interpreter not found on PATH: {python}{hint}")
        return os.path.abspath(found)
    path = Path(os.path.abspath(expanded))
    if path.is_dir():
        for candidate in ("bin/python", "bin/python3", "Scripts/python.exe", "python.exe"):
            if (path / candidate).exists():
                return str(path / candidate)
        raise ProbeError(f"no Python interpreter found in folder {path}")
    if not path.exists():
        raise ProbeError(f"interpreter not found: {python}")
    return str(path)


def _has_slash(value: str) -> bool:
    return os.sep in value or bool(os.altsep and os.altsep in value)


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


def _probe_argv(exe: str) -> list[str]:
    """The probe's command line. ``-B``: the target writes no bytecode. Its start runs the
    environment's ``.pth`` files, and one that imports a module (setuptools'
    ``distutils-precedence.pth``) would otherwise write a ``__pycache__`` into the
    environment; into the scratch copy of an install's prediction, it made the move of
    uv's files refuse the copy."""
    return [exe, "-B", str(Path(_inprocess.__file__))]


_Started = tuple[subprocess.Popen[bytes] | CommandResult, tuple[Any, ...], int]
"""A probe under way: the process, the memo key when it started, and when."""
_PREFETCHED: dict[str, _Started | dict[str, Any]] = {}


def _start(exe: str) -> _Started:
    key = facts_memo.interpreter_key(exe, os.environ)
    return start(_probe_argv(exe)), key, time.time_ns()


def prefetch(python: str, memo_root: Path | None = None) -> None:
    """Start probing ``python`` now, in the background, unless the memo holds its answer
    (:mod:`envguard.probe.fastpath.facts`); :func:`probe_python` of the same interpreter later
    reads that answer instead of starting another. A command calls this as soon as it knows
    its environment, so that the probe (25-80 ms: another interpreter starting) overlaps
    with the import of envguard's own modules. Never raises: a problem is reported by
    :func:`probe_python`."""
    try:
        exe = resolve_python(python)
    except ProbeError:
        return
    if exe in _PREFETCHED or is_current_interpreter(exe):
        return
    known = facts_memo.lookup(exe, os.environ, memo_root or memo_dir())
    _PREFETCHED[exe] = known if known is not None else _start(exe)


def hand_on(python: str, target: Target) -> None:
    """The next :func:`probe_python` of ``python`` in this process takes ``target``'s facts
    instead of probing again: for a command that needs the facts before its snapshot
    (``envguard install`` makes its scratch copy from them), when the memo could not keep
    them (an environment changed a moment ago)."""
    with contextlib.suppress(ProbeError):
        _PREFETCHED[resolve_python(python)] = target.facts


def hand_on_copy(python: str, target: Target, copy_prefix: str) -> bool:
    """Hand on to the next :func:`probe_python` of ``python``, an interpreter of a copy of
    ``target``'s venv at ``copy_prefix``, the facts its probe would print
    (:func:`envguard.probe.fastpath.facts.moved`); False, and nothing handed on, where they
    are not certain (the probe then runs)."""
    facts = facts_memo.moved(target.facts, copy_prefix)
    if facts is None:
        return False
    try:
        check_ran_as(resolve_python(python), facts)
    except ProbeError:
        return False
    hand_on(python, Target(facts=facts))
    return True


@atexit.register
def _discard_prefetched() -> None:
    """At exit: end the probes nobody read (the command failed before it probed)."""
    while _PREFETCHED:
        _, started = _PREFETCHED.popitem()
        if isinstance(started, tuple) and isinstance(started[0], subprocess.Popen):
            stop(started[0])


def probe_python(python: str, memo_root: Path | None = None) -> Target:
    """Run the stdlib-only probe under ``python``; raise ProbeError if it cannot run.

    When ``python`` is the interpreter envguard runs in, the facts are gathered in
    this process instead: a second interpreter start costs 10-80 ms. With ``memo_root``,
    an answer kept there (:mod:`envguard.probe.fastpath.facts`) is used while nothing it
    depends on has changed, and a new answer is kept.
    """
    exe = resolve_python(python)
    if is_current_interpreter(exe):
        return probe_self()
    started = _PREFETCHED.pop(exe, None)
    if started is None and memo_root is not None:
        started = facts_memo.lookup(exe, os.environ, memo_root)
    if isinstance(started, dict):
        check_ran_as(exe, started)
        return Target(facts=started)
    process, key, started_ns = started if started is not None else _start(exe)
    result = finish(process, timeout=PROBE_TIMEOUT_S)
    if not result.ok:
        raise ProbeError(f"cannot probe {exe}: {result.error}")
    try:
        facts = ast.literal_eval(result.stdout.strip().splitlines()[-1])
    except (ValueError, SyntaxError, IndexError, MemoryError, RecursionError):
        raise ProbeError(f"cannot probe {exe}: it printed no facts") from None
    if not isinstance(facts, dict) or "sys_path" not in facts:
        raise ProbeError(f"cannot probe {exe}: unexpected probe output")
    check_ran_as(exe, facts)
    if memo_root is not None:
        facts_memo.remember(exe, os.environ, memo_root, facts, key, started_ns)
    return Target(facts=facts)


def _same_path(a: str, b: str) -> bool:
    if os.path.abspath(a) == os.path.abspath(b):
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def check_ran_as(exe: str, facts: dict[str, Any]) -> None:
    """Raise ProbeError unless the probe ran under ``exe`` itself, in ``exe``'s environment.

    The interpreter reports its ``sys.executable`` and ``sys.prefix``. The executable must
    be ``exe`` or the same file (a venv's ``python`` is a symlink to the base interpreter),
    and the prefix ``exe``'s venv folder, or for an interpreter outside a venv its own
    base prefix. A wrapper script that starts another interpreter fails here.
    """
    reported = str(facts.get("executable") or "")
    prefix = str(facts.get("prefix") or "")
    base = str(facts.get("base_prefix") or prefix)
    same_binary = _same_path(reported, exe) if reported else True
    venv = _venv_prefix(exe)
    same_env = _same_path(prefix, venv) if venv is not None else _same_path(prefix, base)
    if same_binary and same_env:
        return
    raise ProbeError(
        f"--python {exe} ran another interpreter: {reported or 'an unnamed one'} with prefix "
        f"{prefix or 'unknown'}; name the interpreter itself (what sys.executable prints in it)")


# ---------------------------------------------------------------------------- the section

def _abi_tag(soabi: str | None, interpreter_tag: str) -> str | None:
    if not soabi:
        return None
    parts = soabi.split("-")
    if parts[0] == "cpython" and len(parts) > 1:
        return "cp" + parts[1]
    return "_".join(parts[:2]) if len(parts) > 1 else interpreter_tag


def interpreter_section(target: Target, selected_by: str | None = None) -> Interpreter:
    from envguard.model import Interpreter

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
        selected_by=selected_by,
    )
