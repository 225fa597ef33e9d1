"""``--python``: which interpreter a value names, and proof that the one asked for ran.

Real venvs made with uv, envguard as a real subprocess. The wrapper interpreter is a real
shell script that starts another real Python (what a pyenv shim or a mistaken alias does).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from envguard.errors import ProbeError
from envguard.exitcodes import ExitCode
from envguard.probe.interpreter import check_ran_as, resolve_python
from tests.wheelfactory import Venv, VenvFactory


def envguard(*args: str | Path, cwd: Path,
             path: str | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    if path is not None:
        env["PATH"] = path
    return subprocess.run([sys.executable, "-m", "envguard", *map(str, args)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120, check=False)


def snapshot_of(*args: str | Path, cwd: Path, path: str | None = None) -> dict[str, Any]:
    proc = envguard("snapshot", "-q", "--json", "--verify", "none", "--no-cache-marker",
                    *args, cwd=cwd, path=path)
    assert proc.returncode == ExitCode.OK, proc.stderr
    data: dict[str, Any] = json.loads(proc.stdout)
    return data


@pytest.fixture
def target(venvs: VenvFactory) -> Venv:
    return venvs.create("target")


def _same(a: str | Path, b: str | Path) -> bool:
    return os.path.samefile(a, b)


def test_dot_slash_python_is_the_file_in_the_working_directory(target: Venv,
                                                              clean_cwd: Path) -> None:
    """``./python`` in the venv's bin folder: the old code looked ``python`` up on PATH and
    snapshotted envguard's own interpreter instead, silently."""
    own_bin = os.path.dirname(sys.executable)  # another python comes first on PATH
    path = f"{own_bin}{os.pathsep}{os.environ['PATH']}"
    data = snapshot_of("--python", "./python", cwd=target.path / "bin", path=path)
    assert _same(data["interpreter"]["prefix"], target.path)
    assert _same(data["interpreter"]["executable"], target.python)
    # One folder up, relative again, with a parent component.
    data = snapshot_of("--python", "../bin/python", cwd=target.path / "lib", path=path)
    assert _same(data["interpreter"]["prefix"], target.path)


def test_a_relative_path_that_does_not_exist_is_not_looked_up_on_path(clean_cwd: Path) -> None:
    proc = envguard("snapshot", "-q", "--json", "--python", "./python3", cwd=clean_cwd)
    assert proc.returncode == ExitCode.ENVIRONMENT_ERROR
    assert proc.stderr.strip().splitlines() == ["envguard: error: interpreter not found: ./python3"]


def test_resolution_rules(target: Venv, clean_cwd: Path,
                          monkeypatch: pytest.MonkeyPatch) -> None:
    # A bare name is a folder of the working directory if there is one ...
    (clean_cwd / "env").symlink_to(target.path)
    assert resolve_python("env") == str(clean_cwd / "env" / "bin" / "python")
    assert resolve_python("./env/") == str(clean_cwd / "env" / "bin" / "python")
    # ... else a command on PATH, like a shell; always an absolute path.
    monkeypatch.setenv("PATH", str(target.path / "bin"))
    assert resolve_python("python") == str(target.python)
    (clean_cwd / "mypython").write_text("")
    with pytest.raises(ProbeError, match=r"not found on PATH: mypython \(for the file in the "
                                         r"current folder write \./mypython\)"):
        resolve_python("mypython")
    assert resolve_python("./mypython") == str(clean_cwd / "mypython")


def test_venv_symlinks_are_the_interpreter_asked_for(target: Venv, clean_cwd: Path) -> None:
    """A venv's python is a symlink to the base interpreter; python3 a symlink to python; the
    venv folder itself may be reached through a symlink. All of them are accepted."""
    (clean_cwd / "link-to-venv").symlink_to(target.path)
    for asked in (target.python, target.path / "bin" / "python3", target.path,
                  "link-to-venv", "link-to-venv/bin/python"):
        data = snapshot_of("--python", asked, cwd=clean_cwd)
        assert _same(data["interpreter"]["prefix"], target.path), asked
    # A symlink to the venv's python from outside the venv runs as the base interpreter:
    # that is the interpreter this path names, so it is accepted too.
    (clean_cwd / "loose-python").symlink_to(target.python)
    data = snapshot_of("--python", "./loose-python", cwd=clean_cwd)
    assert data["interpreter"]["is_venv"] is False


def test_a_wrapper_that_runs_another_interpreter_is_exit_4(venvs: VenvFactory,
                                                          clean_cwd: Path) -> None:
    other = venvs.create("other")
    wrapper = clean_cwd / "python"
    wrapper.write_text(f'#!/bin/sh\nexec "{other.python}" "$@"\n')
    wrapper.chmod(0o755)
    proc = envguard("snapshot", "-q", "--json", "--python", "./python", cwd=clean_cwd)
    assert proc.returncode == ExitCode.ENVIRONMENT_ERROR, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "ran another interpreter" in lines[0], proc.stderr
    assert str(other.python) in lines[0] and str(wrapper) in lines[0]
    assert proc.stdout == ""


def test_check_ran_as(target: Venv, venvs: VenvFactory) -> None:
    base = os.path.realpath(target.python)
    venv_facts = {"executable": str(target.python), "prefix": str(target.path),
                  "base_prefix": "/usr"}
    check_ran_as(str(target.python), venv_facts)
    check_ran_as(str(target.path / "bin" / "python3"), venv_facts)
    # The base interpreter's facts for the venv's python: another environment.
    with pytest.raises(ProbeError, match="ran another interpreter"):
        check_ran_as(str(target.python), {"executable": base, "prefix": "/usr",
                                          "base_prefix": "/usr"})
    other = venvs.create("other")
    with pytest.raises(ProbeError, match="ran another interpreter"):
        check_ran_as(str(target.python), {"executable": str(other.python),
                                          "prefix": str(other.path), "base_prefix": "/usr"})


# -- the probe started early (interpreter.prefetch) --------------------------------------------

def test_a_prefetched_probe_is_the_one_probe_python_reads(venvs: VenvFactory) -> None:
    from envguard.probe import interpreter

    env = venvs.create()
    fresh = interpreter.probe_python(str(env.python))
    interpreter.prefetch(str(env.python))
    exe = resolve_python(str(env.python))
    started = interpreter._PREFETCHED[exe]
    assert isinstance(started, tuple)
    assert isinstance(started[0], subprocess.Popen)  # a real process, already running
    assert interpreter.probe_python(str(env.python)).facts == fresh.facts
    assert exe not in interpreter._PREFETCHED and started[0].returncode == 0


def test_prefetch_never_raises_and_skips_this_interpreter(tmp_path: Path) -> None:
    from envguard.probe import interpreter

    before = dict(interpreter._PREFETCHED)
    interpreter.prefetch(str(tmp_path / "no-such-python"))
    interpreter.prefetch(sys.executable)
    assert before == interpreter._PREFETCHED
    with pytest.raises(ProbeError, match="interpreter not found"):
        interpreter.probe_python(str(tmp_path / "no-such-python"))


def test_an_unread_prefetched_probe_is_ended_at_exit(venvs: VenvFactory, tmp_path: Path) -> None:
    """A command that fails before it probes (an unknown lock) leaves no probe running."""
    from envguard.probe import interpreter

    env = venvs.create()
    proc = envguard("check", "no-such-lock", "--python", env.python, cwd=tmp_path)
    assert proc.returncode == ExitCode.USAGE, proc.stderr
    assert "Exception ignored" not in proc.stderr and "ResourceWarning" not in proc.stderr
    interpreter.prefetch(str(env.python))
    started = interpreter._PREFETCHED[resolve_python(str(env.python))]
    interpreter._discard_prefetched()  # what atexit runs
    assert not interpreter._PREFETCHED
    assert isinstance(started, tuple) and isinstance(started[0], subprocess.Popen)
    assert started[0].returncode is not None
