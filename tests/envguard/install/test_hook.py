"""``envguard shell-hook``: the printed functions, evaluated by real bash, zsh and fish, route
``pip install`` and ``uv pip install`` in an active venv through ``envguard install``, and
leave everything else (and the bypasses) to the real program. ``envguard``, ``pip`` and
``uv`` are stand-in scripts on PATH that print how they were called."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SHELLS = [s for s in ("bash", "zsh", "fish") if shutil.which(s)]


@pytest.fixture
def stubs(tmp_path: Path) -> Path:
    folder = tmp_path / "bin"
    folder.mkdir()
    for name in ("envguard", "pip", "pip3", "uv"):
        script = folder / name
        script.write_text(f'#!/bin/sh\necho "{name} $*"\n', encoding="utf-8")
        script.chmod(0o755)
    return folder


def hook(shell: str) -> str:
    proc = subprocess.run([sys.executable, "-m", "envguard", "shell-hook", shell],
                          capture_output=True, text=True, check=True, timeout=60)
    return proc.stdout


def run_in(shell: str, stubs: Path, line: str, **env: str) -> str:
    script = f"{hook(shell)}\n{line}\n"
    environ = {"PATH": f"{stubs}{os.pathsep}{os.environ['PATH']}", "HOME": str(stubs.parent),
               **env}
    proc = subprocess.run([shell, "-c", script], capture_output=True, text=True, env=environ,
                          timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


@pytest.mark.parametrize("shell", SHELLS)
def test_installs_in_an_active_venv_go_through_envguard(shell: str, stubs: Path) -> None:
    venv = str(stubs.parent / "venv")
    assert run_in(shell, stubs, "pip install 'a b'", VIRTUAL_ENV=venv) == (
        f"envguard install --python {venv} -- pip install a b")
    assert run_in(shell, stubs, "uv pip sync r.txt", VIRTUAL_ENV=venv) == (
        f"envguard install --python {venv} -- uv pip sync r.txt")
    assert run_in(shell, stubs, "pip3 uninstall x", VIRTUAL_ENV=venv) == (
        f"envguard install --python {venv} -- pip3 uninstall x")


@pytest.mark.parametrize("shell", SHELLS)
def test_everything_else_and_the_bypasses_reach_the_real_program(shell: str,
                                                                 stubs: Path) -> None:
    venv = str(stubs.parent / "venv")
    assert run_in(shell, stubs, "pip list", VIRTUAL_ENV=venv) == "pip list"
    assert run_in(shell, stubs, "uv pip compile x", VIRTUAL_ENV=venv) == "uv pip compile x"
    assert run_in(shell, stubs, "pip install x") == "pip install x"  # no venv active
    assert run_in(shell, stubs, "command pip install x", VIRTUAL_ENV=venv) == "pip install x"
    assert run_in(shell, stubs, "pip install x", VIRTUAL_ENV=venv,
                  ENVGUARD_HOOK="0") == "pip install x"
    assert run_in(shell, stubs, "uv pip install --python /x y", VIRTUAL_ENV=venv) == (
        "uv pip install --python /x y")
    assert run_in(shell, stubs, "pip install --target=/t y", VIRTUAL_ENV=venv) == (
        "pip install --target=/t y")
