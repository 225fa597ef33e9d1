"""A prediction never touches the environment: the scratch copy shares its files by hard
link, and pip and uv replace files rather than write into them. Each case hashes every
file of the venv before and after ``envguard install --dry-run``; pip and uv, install,
upgrade, a forced reinstall of the same version (the rebuild is predicted), uninstall.
Ctrl-C during the prediction and during undo's work on the copy leaves the venv as it was.
Fake torch wheels stand for the CUDA builds (tests/wheelfactory.py)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.envguard.install.test_install import (
    TORCH,
    Scene,
    envguard,
    hashes,
    kept_copy,
    kept_copy_is_bare,
    make_scene,
    no_copy_left,
)
from tests.wheelfactory import VenvFactory, build_wheel, interruptible


def with_tiny_2(scene: Scene) -> Scene:
    """``scene`` with tiny 2.0 (another build of its big file) in its other wheel folder."""
    build_wheel(scene.other, "tiny", "2.0", {"tiny/__init__.py": "x = 2\n",
                                             "tiny/big.bin": b"\1" * 70000})
    return scene


@pytest.fixture
def uv_scene(venvs: VenvFactory, tmp_path: Path) -> Scene:
    return with_tiny_2(make_scene(venvs, tmp_path))


@pytest.fixture(scope="module")
def pip_dry(module_venvs: VenvFactory, tmp_path_factory: pytest.TempPathFactory) -> Scene:
    """One pip scene for every dry run of the module: each of them asserts the venv byte for
    byte unchanged, so none can spoil it for the next (one venv, not one a case)."""
    return with_tiny_2(make_scene(module_venvs, tmp_path_factory.mktemp("pip-dry"),
                                  with_pip=True))


@pytest.fixture(scope="module")
def uv_dry(module_venvs: VenvFactory, tmp_path_factory: pytest.TempPathFactory) -> Scene:
    """The uv scene's counterpart of :func:`pip_dry`."""
    return with_tiny_2(make_scene(module_venvs, tmp_path_factory.mktemp("uv-dry")))


def ctimes(root: Path) -> dict[str, int]:
    """Every file's inode change time below ``root``: a hard link made to a file changes
    it, and with it every memo key of the file (envguard's snapshot memo goes cold)."""
    return {os.path.join(folder, n): os.lstat(os.path.join(folder, n)).st_ctime_ns
            for folder, _dirs, files in os.walk(root) for n in files}


def predicted(scene: Scene, *argv: str) -> dict[str, str]:
    before, touched = hashes(scene.venv.path), ctimes(scene.venv.path)
    proc = envguard("install", "--dry-run", "--format", "json", "--python",
                    str(scene.venv.path), "--", *argv, cwd=scene.cwd)
    assert proc.returncode in (0, 3), proc.stdout + proc.stderr
    assert hashes(scene.venv.path) == before
    assert ctimes(scene.venv.path) == touched
    return {p["name"]: p["action"] for p in json.loads(proc.stdout)["packages"]}


PIP_CASES = [
    (["install", "servestack"], {"servestack": "install"}),
    (["install", "--upgrade", "tiny"], {"tiny": "change"}),
    (["install", "--force-reinstall", "--no-deps", f"torch=={TORCH}"], {"torch": "rebuild"}),
    (["install", "--force-reinstall", "--no-deps", "tiny==1.0", "--find-links", "WHEELS"],
     {}),
    (["uninstall", "tiny"], {"tiny": "remove"}),
]


@pytest.mark.parametrize(("args", "expected"), PIP_CASES)
def test_pip_predictions_leave_the_venv_byte_for_byte_unchanged(
        pip_dry: Scene, args: list[str], expected: dict[str, str]) -> None:
    words = [str(pip_dry.wheels) if a == "WHEELS" else a for a in args]
    links = ["--no-index", "--find-links", str(pip_dry.other)] if args[0] == "install" else []
    changes = predicted(pip_dry, str(pip_dry.venv.python), "-m", "pip", words[0], *links,
                        *words[1:])
    assert {k: v for k, v in changes.items() if k in expected or v != "change"} == expected


UV_CASES = [
    (["install", "--upgrade", "tiny"], {"tiny": "change"}),
    (["install", "--reinstall", f"torch=={TORCH}"], {"torch": "rebuild"}),
    (["install", "--reinstall", "tiny==1.0", "--find-links", "WHEELS"], {}),
    (["uninstall", "tiny"], {"tiny": "remove"}),
]


@pytest.mark.parametrize(("args", "expected"), UV_CASES)
def test_uv_predictions_leave_the_venv_byte_for_byte_unchanged(
        uv_dry: Scene, args: list[str], expected: dict[str, str]) -> None:
    words = [str(uv_dry.wheels) if a == "WHEELS" else a for a in args]
    links = ["--no-index", "--find-links", str(uv_dry.other)] if args[0] == "install" else []
    assert predicted(uv_dry, "uv", "pip", words[0], *links, *words[1:]) == expected


def _interrupt_when_copied(argv: list[str], scene: Scene) -> subprocess.CompletedProcess[str]:
    """Run envguard and send SIGINT as soon as its scratch copy of the venv exists (by its
    name while in use: an earlier install's copy may still be going, removed by a process
    of its own). The copy an earlier prediction kept is removed first, so that the copy
    seen is this run's."""
    environ = dict(os.environ, UV_OFFLINE="1", UV_NO_CONFIG="1", COLUMNS="200")
    shutil.rmtree(kept_copy(scene.venv.path), ignore_errors=True)
    proc = subprocess.Popen([sys.executable, "-m", "envguard", *argv], cwd=scene.cwd,
                            env=environ, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, preexec_fn=interruptible)
    copy = scene.venv.path.with_name(f".{scene.venv.path.name}.envguard-scratch")
    deadline = time.monotonic() + 60
    seen = False
    while time.monotonic() < deadline and proc.poll() is None:
        if os.path.lexists(copy):
            proc.send_signal(signal.SIGINT)
            seen = True
            break
        time.sleep(0.002)
    out, err = proc.communicate(timeout=60)
    assert seen, "the scratch copy was never seen: " + err
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def test_ctrl_c_during_the_prediction_leaves_the_venv_as_it_was(uv_scene: Scene) -> None:
    before = hashes(uv_scene.venv.path)
    done = _interrupt_when_copied(
        ["install", "--yes", "--python", str(uv_scene.venv.path), "--", "uv", "pip",
         "install", "--no-index", "--find-links", str(uv_scene.other), "--reinstall",
         "servestack"], uv_scene)
    assert done.returncode == 130, done.stderr
    assert hashes(uv_scene.venv.path) == before
    assert no_copy_left(uv_scene.venv.path)


def test_ctrl_c_during_undo_leaves_the_venv_as_it_was(uv_scene: Scene) -> None:
    proc = envguard("install", "--yes", "--python", str(uv_scene.venv.path), "--", "uv", "pip",
                    "install", "--no-index", "--find-links", str(uv_scene.other),
                    "--reinstall", "servestack", cwd=uv_scene.cwd)
    assert proc.returncode == 0, proc.stderr
    before = hashes(uv_scene.venv.path)
    done = _interrupt_when_copied(["undo", "--python", str(uv_scene.venv.path)], uv_scene)
    assert done.returncode == 130, done.stderr
    assert hashes(uv_scene.venv.path) == before
    assert no_copy_left(uv_scene.venv.path)


COPY_CASES = [
    ("pip", ["install", "--no-index", "--find-links", "OTHER", "--force-reinstall", "--no-deps",
             f"torch=={TORCH}"]),
    ("pip", ["install", "--no-index", "--find-links", "OTHER", "--upgrade", "tiny"]),
    ("pip", ["uninstall", "tiny"]),
    ("uv", ["install", "--no-index", "--find-links", "OTHER", "--reinstall", f"torch=={TORCH}"]),
    ("uv", ["install", "--no-index", "--find-links", "OTHER", "--upgrade", "tiny"]),
    ("uv", ["uninstall", "tiny"]),
]


@pytest.mark.parametrize("whole", [False, True], ids=["metadata", "whole"])
@pytest.mark.parametrize(("tool", "args"), COPY_CASES)
def test_an_installer_on_either_copy_changes_the_copy_only(
        venvs: VenvFactory, tmp_path: Path, whole: bool, tool: str, args: list[str]) -> None:
    """Both kinds of scratch copy, the installer run on each directly: the venv's files
    hash the same afterwards, the link guard finds nothing, and the copy did change."""
    from envguard.install.command import parse_command
    from envguard.install.scratch import check_guard, scratch_copy, wait_for_removals
    from envguard.restore.build import find_uv, run_process

    scene = with_tiny_2(make_scene(venvs, tmp_path, with_pip=tool == "pip"))
    words = [str(scene.other) if a == "OTHER" else a for a in args]
    argv = (["uv", "pip", *words] if tool == "uv"
            else [str(scene.venv.python), "-m", "pip", *words])
    command = parse_command(argv, uv=find_uv())
    sites = [str(scene.venv.site_packages())]
    env = dict(os.environ, UV_OFFLINE="1", UV_NO_CONFIG="1", PIP_NO_INDEX="1",
               PIP_DISABLE_PIP_VERSION_CHECK="1")
    env.pop("VIRTUAL_ENV", None)
    before = hashes(scene.venv.path)
    with scratch_copy(scene.venv.path, site_packages=None if whole else sites,
                      with_pip=tool == "pip") as (folder, guard, cloned):
        copied_before = hashes(folder)
        result = run_process(command.argv_for(str(folder / "bin" / "python")), timeout=120,
                             env=env)
        assert result.ok, result.lines
        check_guard(guard)
        assert hashes(folder) != copied_before
        assert cloned.linked > 0
    wait_for_removals()
    assert hashes(scene.venv.path) == before
    # a whole copy is removed; a metadata copy is kept for the next prediction, bare
    assert not folder.exists() if whole else kept_copy_is_bare(folder)


SLOW_BACKEND = '''"""An in-tree backend that notes each build in BUILDS_LOG, then takes a second."""
import base64, hashlib, os, time, zipfile


def _hash(data):
    digest = hashlib.sha256(data).digest()
    return "sha256=" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    with open(os.environ["BUILDS_LOG"], "a") as log:
        log.write("build\\n")
    time.sleep(1.5)
    info = "slow-1.0.dist-info/"
    files = {"slow/__init__.py": b"",
             info + "METADATA": b"Metadata-Version: 2.1\\nName: slow\\nVersion: 1.0\\n\\n",
             info + "WHEEL": (b"Wheel-Version: 1.0\\nGenerator: t\\nRoot-Is-Purelib: true\\n"
                              b"Tag: py3-none-any\\n\\n")}
    record = "".join("%s,%s,%d\\n" % (p, _hash(d), len(d)) for p, d in files.items())
    files[info + "RECORD"] = (record + info + "RECORD,,\\n").encode()
    name = "slow-1.0-py3-none-any.whl"
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w") as zf:
        for path, data in files.items():
            zf.writestr(path, data)
    return name
'''


def test_ctrl_c_during_the_real_install_lets_it_finish_and_records_it(
        venvs: VenvFactory, tmp_path: Path) -> None:
    """pip builds the project twice (the copy, then the venv); Ctrl-C during the second
    build: the installer is not stopped half-way, the change is recorded, exit 130."""
    scene = make_scene(venvs, tmp_path, with_pip=True)
    project, log = tmp_path / "slow", tmp_path / "builds.log"
    project.mkdir()
    (project / "backend.py").write_text(SLOW_BACKEND, encoding="utf-8")
    (project / "pyproject.toml").write_text(
        '[build-system]\nrequires = []\nbuild-backend = "backend"\nbackend-path = ["."]\n'
        '[project]\nname = "slow"\nversion = "1.0"\n', encoding="utf-8")
    environ = dict(os.environ, BUILDS_LOG=str(log), PIP_NO_INDEX="1",
                   PIP_DISABLE_PIP_VERSION_CHECK="1", COLUMNS="200")
    environ.pop("VIRTUAL_ENV", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "envguard", "install", "--python", str(scene.venv.path), "--",
         str(scene.venv.python), "-m", "pip", "install", str(project)], cwd=scene.cwd,
        env=environ, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=interruptible)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and proc.poll() is None:
        if log.exists() and log.read_text().count("build") >= 2:
            proc.send_signal(signal.SIGINT)
            break
        time.sleep(0.01)
    out, err = proc.communicate(timeout=90)
    assert log.read_text().count("build") == 2, err
    assert proc.returncode == 130, out + err
    assert "the installer was let finish" in err
    assert (scene.venv.site_packages() / "slow-1.0.dist-info").is_dir()
    listed = envguard("revisions", "--python", str(scene.venv.path), "--format", "json",
                      cwd=scene.cwd)
    assert [r["changes"] for r in json.loads(listed.stdout)["revisions"]] == [["+slow 1.0"]]


def test_the_copy_has_one_name_and_one_holder(tmp_path: Path) -> None:
    """The copy's folder is the same every time (uv finds its interpreter in its cache by
    path), and a second holder is refused while the first works, not let in beside it."""
    from envguard.install.scratch import EnvironmentBusy, scratch_copy, wait_for_removals

    prefix = tmp_path / "venv"
    (prefix / "bin").mkdir(parents=True)
    (prefix / "pyvenv.cfg").write_text("home = /usr/bin\n")
    names = []
    for _ in range(2):
        with scratch_copy(prefix, site_packages=[]) as (folder, _guard, _cloned):
            names.append(folder.name)
            with (pytest.raises(EnvironmentBusy, match="another envguard process"),
                  scratch_copy(prefix, site_packages=[])):
                pass
            assert folder.is_dir()
        wait_for_removals()
    assert names == [".venv.envguard-scratch"] * 2
    assert sorted(p.name for p in tmp_path.iterdir()) == [".venv.envguard-scratch", "venv"]
