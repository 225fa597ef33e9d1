"""Writing a lockfile safely (issue 22, items 6 and 7): several ``envguard lock`` at once keep
every entry, and ``--entry`` is a name, never a path or a terminal escape.

Real processes against a real uv-built venv (a fake torch and a ``demo-train`` command).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from envguard.exitcodes import ExitCode
from envguard.gate import read_lock
from tests.wheelfactory import Venv, VenvFactory, build_wheel, fake_torch_files

NAME = "demo-train"


@pytest.fixture(scope="module")
def venv(module_venvs: VenvFactory) -> Venv:
    venvs = module_venvs
    wheels = venvs.wheels
    torch = build_wheel(wheels, "torch", "2.11.0+cu128", fake_torch_files())
    demo = build_wheel(wheels, NAME, "1.0", {"demo_train/__init__.py": "def main(): pass\n"},
                       requires=("torch",), scripts={NAME: "demo_train:main"})
    env = venvs.create("demo")
    venvs.uv_install(env, torch, demo)
    return env


@pytest.fixture
def project(tmp_path: Path) -> Path:
    project = (tmp_path / "project").resolve()
    (project / "lockfiles").mkdir(parents=True)
    (project / "pyproject.toml").write_text('[project]\nname = "scratch"\nversion = "0"\n')
    return project


def _args(venv: Venv, *extra: str) -> list[str]:
    return [sys.executable, "-m", "envguard", "lock", NAME, "--python", str(venv.python),
            *extra]


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "ENVGUARD_VERIFIED"}


def _lock(project: Path, venv: Venv, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(_args(venv, *extra), cwd=project, env=_env(), capture_output=True,
                          text=True, timeout=120, check=False)


# -------------------------------------------------------------------- concurrent locks

def test_parallel_locks_keep_every_entry(project: Path, venv: Venv) -> None:
    """One entry first, then six `envguard lock` processes started together, twice: every
    entry is in the lock, and every snapshot file beside it belongs to an entry."""
    first = _lock(project, venv, "--entry", "node-0")
    assert first.returncode == ExitCode.OK, first.stderr
    expected = {"node-0"}
    for round_ in range(2):
        ids = [f"node-{round_}-{i}" for i in range(6)]
        procs = [subprocess.Popen(_args(venv, "--entry", e), cwd=project, env=_env(),
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for e in ids]
        for proc in procs:
            _, err = proc.communicate(timeout=180)
            assert proc.returncode == ExitCode.OK, err
        expected |= set(ids)
        lock = read_lock(project / "lockfiles" / f"{NAME}.toml")
        assert {e.id for e in lock.entries} == expected
    snapshots = {p.name for p in (project / "lockfiles" / f"{NAME}.snapshots").iterdir()}
    assert snapshots == {f"{e}.json" for e in expected}  # none orphaned
    assert {e.snapshot_file for e in lock.entries} == {f"{NAME}.snapshots/{s}"
                                                       for s in snapshots}
    leftovers = [p.name for p in (project / "lockfiles").iterdir()
                 if p.name.endswith(".tmp")]
    assert leftovers == []


def _wait_until_open(proc: subprocess.Popen[str], path: Path, limit_s: float = 60.0) -> None:
    """Until ``proc`` holds ``path`` open (read from /proc/PID/fd)."""
    deadline = time.monotonic() + limit_s
    fds = Path(f"/proc/{proc.pid}/fd")
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        with contextlib.suppress(OSError):
            if any(os.readlink(fd) == str(path) for fd in fds.iterdir()):
                return
        time.sleep(0.05)
    raise AssertionError(f"{path} was never opened")


def test_a_lock_waits_for_the_one_holding_the_lockfile(project: Path, venv: Venv) -> None:
    """While another process holds the flock, `envguard lock` takes its snapshot but does
    not write; once released, it re-reads the lock and keeps what was added meanwhile."""
    lock_file = project / "lockfiles" / f".{NAME}.toml.lock"
    fd = os.open(lock_file, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        proc = subprocess.Popen(_args(venv, "--entry", "waiting"), cwd=project, env=_env(),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        # It opens the lock file once its snapshot is taken: then it can only be waiting.
        _wait_until_open(proc, lock_file)
        time.sleep(0.5)
        assert proc.poll() is None, proc.communicate()
        toml = project / "lockfiles" / f"{NAME}.toml"
        assert not toml.exists()
        # Meanwhile "another node" adds its entry (as the holder of the lock would).
        other = _lock(project, venv, "--entry", "holder", "--lock",
                      str(project / "lockfiles" / "scratch.toml"))
        assert other.returncode == ExitCode.OK, other.stderr
        os.replace(project / "lockfiles" / "scratch.toml", toml)
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == ExitCode.OK, err
    assert {e.id for e in read_lock(toml).entries} == {"holder", "waiting"}


# -------------------------------------------------------------------- --entry and the name

@pytest.mark.parametrize("entry", ["../../../escape", "sub/dir", "..", ".hidden", "",
                                   "ok\x1b[31mred", "trailing\n", "x" * 129])
def test_a_bad_entry_id_is_one_line_and_writes_nothing(project: Path, venv: Venv,
                                                       entry: str) -> None:
    proc = _lock(project, venv, "--entry", entry)
    assert proc.returncode == ExitCode.USAGE, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("envguard: error: entry id "), proc.stderr
    assert "\x1b" not in proc.stderr and proc.stdout == ""
    assert sorted(p.name for p in (project / "lockfiles").iterdir()) == []
    assert sorted(p.name for p in project.parent.iterdir()) == ["project"]


def test_a_lock_name_with_a_trailing_newline_is_refused(project: Path, venv: Venv) -> None:
    proc = subprocess.run([sys.executable, "-m", "envguard", "lock", f"{NAME}\n", "--python",
                           str(venv.python), "--distribution", NAME], cwd=project, env=_env(),
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == ExitCode.USAGE, proc.stderr
    assert "lock name" in proc.stderr
    assert list((project / "lockfiles").iterdir()) == []


def test_the_lockfile_path_is_escaped_on_output(project: Path, venv: Venv) -> None:
    odd = project / "lockfiles" / "odd\x1b[2Jname.toml"
    proc = _lock(project, venv, "--entry", "fine", "--lock", str(odd))
    assert proc.returncode == ExitCode.OK, proc.stderr
    assert "\x1b" not in proc.stdout
    assert "odd\\x1b[2Jname.toml: added entry fine" in proc.stdout
    assert odd.is_file()
