"""A refusal fits on a screen and ends with the command to run next (issue 34, item 3).

A whole-environment lock of a real uv-built venv, then thirty packages installed into it
for real: ``envguard check`` and ``run`` summarise (counts per section, the first few,
"and N more") in at most 20 lines and end with the exact next command, which the tests
run; ``--verbose`` and ``--format json`` keep every change.
"""

from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path

import pytest

from envguard.exitcodes import ExitCode
from tests.envguard.gate.test_lock_scope import envguard
from tests.wheelfactory import Venv, VenvFactory, build_wheel

EXTRA = [f"extra{i:02d}" for i in range(30)]


@pytest.fixture
def env(venvs: VenvFactory, wheel_dir: Path) -> Venv:
    made = venvs.create()
    venvs.uv_install(made, build_wheel(wheel_dir, "alpha", "1.0", {"alpha/__init__.py": ""}))
    return made


@pytest.fixture
def project(tmp_path: Path) -> Path:
    folder = (tmp_path / "train").resolve()
    folder.mkdir()
    (folder / "train.py").write_text("print('trained')\n")
    return folder


def next_command(output: str, cwd: Path, env: Venv) -> subprocess.CompletedProcess[str]:
    """Run the output's last line, as a person pastes it (``envguard`` is this one)."""
    argv = shlex.split(output.splitlines()[-1])
    assert argv[0] == "envguard", output
    return envguard(*argv[1:], cwd=cwd, env=env)


def drifted(project: Path, env: Venv, venvs: VenvFactory, wheel_dir: Path) -> None:
    locked = envguard("lock", "train", cwd=project, env=env)
    assert locked.returncode == ExitCode.OK, locked.stderr
    venvs.uv_install(env, *(build_wheel(wheel_dir, n, "1.0", {f"{n}/__init__.py": ""})
                            for n in EXTRA))


def test_thirty_new_packages_are_summarised(project: Path, env: Venv, venvs: VenvFactory,
                                            wheel_dir: Path) -> None:
    drifted(project, env, venvs, wheel_dir)
    check = envguard("check", "train", cwd=project, env=env)
    assert check.returncode == ExitCode.DRIFT, check.stderr
    lines = check.stdout.splitlines()
    assert len(lines) <= 20, check.stdout
    assert "  packages (30): extra00 (new), extra01 (new), extra02 (new) and 27 more" in lines
    assert "every finding and change: envguard check train --verbose (or --format json)" \
        in lines
    assert lines[-2:] == ["if the change is intended, re-lock this environment (else undo "
                          "it: the remedies are in --verbose):", "  envguard lock train"]

    verbose = envguard("check", "train", "--verbose", cwd=project, env=env)
    assert verbose.returncode == ExitCode.DRIFT
    assert all(name in verbose.stdout for name in EXTRA)
    assert len(verbose.stdout.splitlines()) > 40
    as_json = envguard("check", "train", "--format", "json", cwd=project, env=env)
    doc = json.loads(as_json.stdout)
    assert sorted(c["key"] for c in doc["changes"]) == EXTRA  # complete

    refused = envguard("run", "--lock", "train", "--", "python", "train.py", cwd=project,
                       env=env)
    assert refused.returncode == ExitCode.REFUSED, refused.stderr
    assert "trained" not in refused.stdout
    assert len(refused.stderr.splitlines()) <= 22, refused.stderr  # + environment, refused
    assert refused.stderr.splitlines()[-1] == "  envguard lock train"

    relocked = next_command(check.stdout, project, env)
    assert relocked.returncode == ExitCode.OK, relocked.stderr
    assert envguard("check", "train", cwd=project, env=env).returncode == ExitCode.OK


def test_the_next_command_names_a_lock_found_in_a_parent_folder(
        project: Path, env: Venv, venvs: VenvFactory, wheel_dir: Path) -> None:
    """From a subfolder the lock is ../lockfiles/train.toml: `envguard lock train` there
    would make another lock, so the command names the one checked."""
    drifted(project, env, venvs, wheel_dir)
    sub = project / "configs"
    sub.mkdir()
    check = envguard("check", "train", cwd=sub, env=env)
    assert check.returncode == ExitCode.DRIFT
    lock_path = project / "lockfiles" / "train.toml"
    assert check.stdout.splitlines()[-1] == f"  envguard lock train --lock {lock_path}"
    assert next_command(check.stdout, sub, env).returncode == ExitCode.OK
    assert not (sub / "lockfiles").exists()
    assert envguard("check", "train", cwd=sub, env=env).returncode == ExitCode.OK


def test_a_forbidden_package_ends_with_its_removal(project: Path, env: Venv,
                                                   venvs: VenvFactory,
                                                   wheel_dir: Path) -> None:
    """Re-locking would be refused too: the command is the uninstall, and it works."""
    assert envguard("lock", "train", cwd=project, env=env).returncode == ExitCode.OK
    venvs.uv_install(env, build_wheel(wheel_dir, "sglang", "0.5.6", {"sglang/__init__.py": ""}))
    check = envguard("check", "train", cwd=project, env=env)
    assert check.returncode == ExitCode.DRIFT
    last = check.stdout.splitlines()[-1]
    assert last.startswith("  uv pip uninstall") and last.endswith("sglang"), check.stdout
    assert "remove what the lock forbids first" in check.stdout


def test_a_match_says_so_in_one_line(project: Path, env: Venv) -> None:
    """The miss: a matching environment gets no summary and no next command."""
    assert envguard("lock", "train", cwd=project, env=env).returncode == ExitCode.OK
    check = envguard("check", "train", cwd=project, env=env)
    assert check.returncode == ExitCode.OK
    assert check.stdout.startswith("envguard: matches entry ")
    assert "envguard lock" not in check.stdout
