"""Which environment a command looks at when it is not told: one rule for every command.

:func:`discover` decides, in this order (the first that applies wins):

1. ``--python PY`` (made an interpreter by :func:`~envguard.probe.interpreter.resolve_python`);
2. ``ENVGUARD_PYTHON``, the same kinds of value;
3. ``VIRTUAL_ENV``, an activated venv;
4. ``CONDA_PREFIX``, an activated conda env that is not the base env;
5. the venv the working directory is in, or a ``.venv`` in it or a parent (the nearest);
6. ``CONDA_PREFIX`` of the base env, which counts as a system environment, as uv counts it;
7. the first ``python3`` (else ``python``) on ``PATH``, as uv takes a system interpreter;
8. envguard's own interpreter, only when ``PATH`` holds no Python at all.

Rule 7 keeps a tool install (``uv tool install envguard``, pipx) from silently reading its
own tool venv when it is run outside any environment; every command says which rule chose
(``envguard: environment: /usr (python3 on PATH)``).

A variable that names a folder without an interpreter (a venv deleted after it was
activated) is an :class:`~envguard.errors.InputError` that names the variable, never a
silent fall through to the next rule. Nothing here starts an interpreter, except to ask a
shim on ``PATH`` (rule 7) which interpreter it starts.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from envguard.errors import InputError, ProbeError
from envguard.frozen import frozen
from envguard.probe.interpreter import resolve_python

PYTHON_OPTION = "--python"
ENVGUARD_PYTHON = "ENVGUARD_PYTHON"
VIRTUAL_ENV = "VIRTUAL_ENV"
CONDA_PREFIX = "CONDA_PREFIX"
CONDA_BASE = "CONDA_PREFIX, base env"
DOT_VENV = ".venv"
WORKING_DIR = "the working directory's venv"
PATH_PYTHON = "python3 on PATH"
OWN = "envguard's own interpreter"

_INTERPRETERS = ("bin/python", "bin/python3", "Scripts/python.exe", "python.exe")


@frozen
class Selection:
    """The environment chosen, and the rule that chose it."""

    executable: str
    """The interpreter's absolute path."""
    prefix: str
    """The environment's folder (a venv, a conda env, or the interpreter's installation)."""
    selected_by: str
    """The rule: ``--python``, ``ENVGUARD_PYTHON``, ``VIRTUAL_ENV``, ``CONDA_PREFIX``, ...."""

    @property
    def python(self) -> str | None:
        """What to pass as an engine's ``python``: None for envguard's own interpreter."""
        return None if self.selected_by == OWN else self.executable

    def describe(self, home: str | None = None) -> str:
        """``~/train/.venv (VIRTUAL_ENV)``."""
        return f"{shorten_home(self.prefix, home)} ({self.selected_by})"


def shorten_home(path: str, home: str | None = None) -> str:
    """``path`` with the home folder written ``~``."""
    home = home if home is not None else os.path.expanduser("~")
    home = home.rstrip(os.sep)
    if home and (path == home or path.startswith(home + os.sep)):
        return "~" + path[len(home):]
    return path


def prefix_of(executable: str) -> str:
    """The environment folder of an interpreter path: the venv (``pyvenv.cfg`` one level
    above ``bin/``), else the folder above ``bin/`` (a conda env, a system install)."""
    folder = os.path.dirname(os.path.dirname(executable))
    return folder or os.path.dirname(executable)


def interpreter_in(folder: Path) -> str | None:
    """The interpreter of an environment folder, or None."""
    for candidate in _INTERPRETERS:
        path = folder / candidate
        if path.is_file() and os.access(path, os.X_OK):
            return str(path)
    return None


def discover(python: str | None, *, env: Mapping[str, str], cwd: Path) -> Selection:
    """The environment a command looks at (see the module's docstring for the order)."""
    if python:
        return _named(python, PYTHON_OPTION)
    value = env.get(ENVGUARD_PYTHON, "")
    if value:
        try:
            return _named(value, ENVGUARD_PYTHON)
        except ProbeError as exc:
            raise InputError(f"{ENVGUARD_PYTHON}={value}: {exc}") from None
    venv = env.get(VIRTUAL_ENV, "")
    if venv:
        return _from_folder(_absolute(venv, cwd), VIRTUAL_ENV)
    conda = env.get(CONDA_PREFIX, "")
    conda_base = bool(conda) and is_conda_base(_absolute(conda, cwd), env)
    if conda and not conda_base:
        return _from_folder(_absolute(conda, cwd), CONDA_PREFIX)
    found = find_dot_venv(cwd)
    if found is not None:
        return found
    if conda:
        return _from_folder(_absolute(conda, cwd), CONDA_BASE)
    on_path = python_on_path(env)
    if on_path is not None:
        return on_path
    return this_process()


def python_on_path(env: Mapping[str, str]) -> Selection | None:
    """The first ``python3``, else ``python``, on ``env``'s ``PATH`` (its absolute path,
    links kept: a venv's ``bin/python3`` is that venv's), or None."""
    search = env.get("PATH")
    if not search:
        return None
    for name in ("python3", "python"):
        found = shutil.which(name, path=search)
        exe = _through_shim(os.path.abspath(found), env) if found is not None else None
        if exe is not None:
            return Selection(executable=exe, prefix=prefix_of(exe), selected_by=PATH_PYTHON)
    return None


def _through_shim(path: str, env: Mapping[str, str]) -> str | None:
    """``path`` itself, or, for a script that starts another interpreter (a pyenv or asdf
    shim), the interpreter it starts, asked once as uv asks it; None when it answers
    nothing usable. Only this rule runs anything, and only for a script."""
    try:
        with open(path, "rb") as handle:
            if handle.read(2) != b"#!":
                return path
    except OSError:
        return None
    try:
        proc = subprocess.run([path, "-I", "-c", "import sys; print(sys.executable)"],
                              env=dict(env), capture_output=True, text=True, timeout=20,
                              check=False, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return None
    answer = proc.stdout.strip()
    return answer if proc.returncode == 0 and os.path.isabs(answer) and os.path.isfile(answer) \
        else None


def this_process() -> Selection:
    """The interpreter running this code: what the Python API looks at by default."""
    return Selection(executable=sys.executable, prefix=sys.prefix, selected_by=OWN)


def _absolute(value: str, cwd: Path) -> Path:
    path = Path(os.path.expanduser(value))
    return path if path.is_absolute() else cwd / path


def _named(value: str, rule: str) -> Selection:
    exe = resolve_python(value)
    return Selection(executable=exe, prefix=prefix_of(exe), selected_by=rule)


def _from_folder(folder: Path, rule: str) -> Selection:
    variable = rule.split(",")[0]
    if not folder.is_dir():
        raise InputError(f"{variable}={folder}: no such folder (a removed environment that is "
                         f"still activated?); activate another one or unset {variable}")
    exe = interpreter_in(folder)
    if exe is None:
        raise InputError(f"{variable}={folder}: no Python interpreter in that folder (bin/python "
                         f"is missing); recreate the environment or unset {variable}")
    return Selection(executable=exe, prefix=str(folder), selected_by=rule)


def is_conda_base(prefix: Path, env: Mapping[str, str]) -> bool:
    """Whether ``CONDA_PREFIX`` is conda's base env, which counts as a system environment.

    uv's rule (``CondaEnvironmentKind::from_prefix_path``): a pixi env is never the base;
    ``_CONDA_ROOT`` equal to the prefix is; otherwise, with ``CONDA_DEFAULT_ENV`` set to a
    name that is neither the prefix nor the prefix's folder name (``base`` for
    ``/opt/conda``), it is the base. And the base env's folder is the root install: it
    holds ``conda-meta/`` and ``envs/``.
    """
    if (prefix / "conda-meta" / "pixi").is_file():
        return False
    root = env.get("_CONDA_ROOT") or env.get("CONDA_ROOT")
    if root and os.path.abspath(root) == os.path.abspath(prefix):
        return True
    if (prefix / "conda-meta").is_dir() and (prefix / "envs").is_dir():
        return True
    current = env.get("CONDA_DEFAULT_ENV", "")
    if not current:
        return False
    if os.path.abspath(os.path.expanduser(current)) == os.path.abspath(prefix):
        return False  # an env made with `conda create -p PATH`
    return prefix.name != current


def find_dot_venv(cwd: Path) -> Selection | None:
    """The venv the working directory is in, or a ``.venv`` in it or a parent (the nearest
    wins). A ``.venv`` without an interpreter is an InputError: it is the project's env."""
    for folder in (cwd, *cwd.parents):
        inside = interpreter_in(folder) if (folder / "pyvenv.cfg").is_file() else None
        if inside is not None:
            return Selection(executable=inside, prefix=str(folder), selected_by=WORKING_DIR)
        candidate = folder / ".venv"
        if candidate.is_dir():
            exe = interpreter_in(candidate)
            if exe is None:
                raise InputError(f"{candidate}: a .venv folder without a Python interpreter "
                                 "(bin/python); recreate it, remove it or pass --python PY")
            return Selection(executable=exe, prefix=str(candidate), selected_by=DOT_VENV)
    return None
