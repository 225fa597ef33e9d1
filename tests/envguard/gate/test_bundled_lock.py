"""The bundled lock where envguard is installed from its wheel (issue 34, item 2).

The wheel puts the checkout's ``lockfiles/`` inside the package (``envguard/lockfiles/``)
and ``dflash/`` beside ``envguard/`` in site-packages. The lock's ``dflash/**/*.py`` must
resolve there, not inside ``site-packages/envguard/`` (where every pinned file was
"missing": 47 tracked files changed on a fresh install).

A real wheel, built by ``uv build`` from a copy of this tree whose bundled lock is
re-pinned to the copy's own files (as a release is: the lock is regenerated after any
edit under ``dflash/``, and other work may have edited it since), installed
non-editable by uv into a real venv; the installed envguard runs in a real subprocess.
What cannot be had offline here is taken from uv's own cache: the build backend
(hatchling) and envguard's dependencies. Without them the tests skip and say so.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from envguard.gate import read_lock
from envguard.gate.lockfile import dump_lock, hash_files
from tests.conftest import UV, venv_factory
from tests.paths import REPO
from tests.wheelfactory import Venv

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

PROBE = """
import json
from envguard.gate import check_command
result = check_command("dflash-train")
print(json.dumps({
    "lock": result.lock_path,
    "root": result.project_root,
    "files": sorted({c.key for comp in result.comparisons for c in comp.diff.changes
                     if c.section == "files"}),
}))
"""


def _uv_env() -> dict[str, str]:
    """uv offline, with its default cache (the suite's own cache holds no build backend)."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("UV_CACHE_DIR", "VIRTUAL_ENV", "PYTHONPATH", "UV_FIND_LINKS",
                        "UV_INDEX_URL", "UV_EXTRA_INDEX_URL", "UV_CONSTRAINT")}
    env.update({"UV_OFFLINE": "1", "UV_NO_CONFIG": "1", "UV_LINK_MODE": "copy",
                "UV_PYTHON_DOWNLOADS": "never"})
    return env


def _uv(*args: str | Path) -> subprocess.CompletedProcess[str]:
    assert UV is not None
    return subprocess.run([UV, *map(str, args)], env=_uv_env(), capture_output=True,
                          text=True, timeout=300, check=False)


@pytest.fixture(scope="session")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """envguard's wheel, built once a session from a copy of this tree."""
    if UV is None:
        pytest.skip("uv is not installed")
    src = tmp_path_factory.mktemp("envguard-src")
    skip = shutil.ignore_patterns("__pycache__", "*.pyc")
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    wheel_target = project["tool"]["hatch"]["build"]["targets"]["wheel"]
    # The packages, what the wheel force-includes (the lockfiles, ...), and the readme.
    for name in {*wheel_target["packages"], *wheel_target.get("force-include", {}),
                 "pyproject.toml", project["project"]["readme"]}:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, src / name, ignore=skip)
        else:
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, src / name)
    lock_path = src / "lockfiles" / "dflash-train.toml"
    lock = read_lock(lock_path)
    lock_path.write_text(dump_lock(dataclasses.replace(lock, files=hash_files(lock, src))))
    out = tmp_path_factory.mktemp("envguard-wheel")
    built = _uv("build", "--wheel", "--quiet", "--out-dir", out, src)
    if built.returncode != 0:
        pytest.skip(f"cannot build envguard's wheel offline: {built.stderr.strip()[-300:]}")
    (found,) = out.glob("envguard-*.whl")
    return found


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory, wheel: Path) -> Venv:
    """A venv with envguard installed from its wheel (not editable)."""
    venvs = venv_factory(tmp_path_factory.mktemp("bundled"))
    env = venvs.create("installed")
    done = _uv("pip", "install", "--python", env.python, wheel)
    if done.returncode != 0:
        pytest.skip(f"envguard's dependencies are not in uv's cache: {done.stderr[-300:]}")
    return env


def _run(env: Venv, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    variables = {k: v for k, v in os.environ.items()
                 if k not in ("ENVGUARD_VERIFIED", "VIRTUAL_ENV", "PYTHONPATH")}
    return subprocess.run([str(env.python), *args], cwd=cwd, env=variables,
                          capture_output=True, text=True, timeout=120, check=False)


def _probe(env: Venv, cwd: Path) -> dict[str, object]:
    done = _run(env, "-c", PROBE, cwd=cwd)
    assert done.returncode == 0, done.stderr
    result: dict[str, object] = json.loads(done.stdout)
    return result


def test_the_bundled_lock_pins_the_installed_files(installed: Venv, tmp_path: Path) -> None:
    """The hit: not one of the trainer's own files is reported as changed; the lock and its
    file root are the installed ones, not this checkout's."""
    site = installed.site_packages().resolve()
    found = _probe(installed, tmp_path)
    assert found["lock"] == str(site / "envguard" / "lockfiles" / "dflash-train.toml")
    assert found["root"] == str(site)
    assert (site / "dflash" / "config.py").is_file()
    assert found["files"] == []


def test_an_installed_file_edited_is_still_found(installed: Venv, tmp_path: Path) -> None:
    """The miss: the same check names an installed trainer file that was edited."""
    target = installed.site_packages() / "dflash" / "config.py"
    original = target.read_bytes()
    try:
        target.write_bytes(original + b"# edited\n")
        found = _probe(installed, tmp_path)
    finally:
        target.write_bytes(original)
    assert found["files"] == [str(target.resolve())]


def test_check_of_the_installed_lock_is_short_and_says_what_next(installed: Venv,
                                                                tmp_path: Path) -> None:
    """This venv holds no torch: the bundled entries do not match. The refusal fits on a
    screen and ends with the command that locks this environment here."""
    done = _run(installed, "-m", "envguard", "check", "dflash-train", "--python",
                str(installed.path), cwd=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) <= 20, done.stdout
    assert "[file-changed]" not in done.stdout
    assert lines[-1] == f"  envguard lock dflash-train --python {installed.path}"
