"""``envguard install`` end to end: real uv venvs from tiny wheels, envguard as a real
subprocess, offline. The CUDA builds are fake torch wheels (tests/wheelfactory.py): two
builds of 2.11.0+cu128 that differ only in their git_version, as in the incident.

The environment is hashed file by file before and after each prediction: the scratch copy
shares the environment's files by hard link, and no installer may write through one.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.wheelfactory import Venv, VenvFactory, build_wheel, fake_torch_files, run_checked

GOOD_GIT = "70d99e998b4955e0049d13a98d77ae1b14db1f45"
OTHER_GIT = "e2b8a1c7" * 5
TORCH = "2.11.0+cu128"


@dataclasses.dataclass(frozen=True)
class Scene:
    venv: Venv
    wheels: Path
    """The good torch build, tiny, extra."""
    other: Path
    """The other torch build of the same version, and servestack, which requires torch."""
    cwd: Path


def hashes(root: Path) -> dict[str, str]:
    """Every file and link below ``root``: its content's digest (a link: its target)."""
    out = {}
    for folder, dirs, files in os.walk(root):
        for name in [*files, *(d for d in dirs if os.path.islink(os.path.join(folder, d)))]:
            path = os.path.join(folder, name)
            rel = os.path.relpath(path, root)
            if os.path.islink(path):
                out[rel] = "link:" + os.readlink(path)
            else:
                with open(path, "rb") as f:
                    out[rel] = hashlib.sha256(f.read()).hexdigest()
    return out


def envguard(*args: str, cwd: Path, env: dict[str, str] | None = None,
             timeout: float = 120) -> subprocess.CompletedProcess[str]:
    environ = dict(os.environ)
    environ.update({"UV_OFFLINE": "1", "UV_NO_CONFIG": "1", "UV_PYTHON_DOWNLOADS": "never",
                    "PIP_NO_INDEX": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1",
                    "PIP_CONFIG_FILE": os.devnull, "COLUMNS": "200"})
    environ.pop("VIRTUAL_ENV", None)
    environ.update(env or {})
    return subprocess.run([sys.executable, "-m", "envguard", *args], cwd=cwd, env=environ,
                          capture_output=True, text=True, timeout=timeout, check=False)


def no_copy_left(env: Path) -> bool:
    """No copy is left but the one kept for the next prediction, and that holds nothing an
    installer wrote (:func:`kept_copy_is_bare`): what a move set aside, and what the
    installer wrote into the copy, is removed by a process of its own after envguard ends
    (given 30 s here)."""
    kept = kept_copy(env)
    deadline = time.monotonic() + 30
    while [p for p in env.parent.iterdir() if "envguard-scratch" in p.name and p != kept]:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return not os.path.lexists(kept) or kept_copy_is_bare(kept)


def kept_copy(env: Path) -> Path:
    """Where envguard keeps its copy of ``env`` between predictions."""
    return env.with_name(f".{env.name}.envguard-scratch")


def kept_copy_is_bare(kept: Path) -> bool:
    """Only what the copy is made of: folders, symbolic links, ``pyvenv.cfg``, the
    interpreter and envguard's ``.gitignore``; no file an installer wrote."""
    for folder, _dirs, files in os.walk(kept):
        for name in files:
            path = os.path.join(folder, name)
            rel = os.path.relpath(path, kept)
            if not (os.path.islink(path) or rel in ("pyvenv.cfg", ".gitignore")
                    or rel.startswith(("bin/python", "Scripts/python"))):
                return False
    return True


def fingerprints(venv: Venv, cwd: Path) -> dict[str, Any]:
    proc = envguard("snapshot", "--python", str(venv.python), "--json", cwd=cwd)
    assert proc.returncode == 0, proc.stderr
    packages = json.loads(proc.stdout)["packages"]
    return {p["name"]: (p["version"], p["fingerprint"]) for p in packages}


def make_scene(venvs: VenvFactory, root: Path, *, with_pip: bool = False) -> Scene:
    wheels, other = venvs.wheels, root / "other"
    build_wheel(wheels, "torch", TORCH, fake_torch_files(git_version=GOOD_GIT))
    build_wheel(wheels, "tiny", "1.0", {"tiny/__init__.py": "x = 1\n",
                                        "tiny/big.bin": b"\0" * 70000})
    build_wheel(wheels, "extra", "1.0", {"extra/__init__.py": ""})
    build_wheel(other, "torch", TORCH, fake_torch_files(git_version=OTHER_GIT))
    build_wheel(other, "servestack", "1.0", {"servestack/__init__.py": ""},
                requires=(f"torch=={TORCH}",))
    venv = venvs.create(with_pip=with_pip)
    if with_pip:
        venvs.pip_install(venv, *sorted(p for p in wheels.iterdir()
                                        if p.name.startswith(("torch", "tiny"))))
    else:  # by name from --find-links, as from an index: no direct URL recorded
        run_checked([venvs.uv, "pip", "install", "--quiet", "--python", str(venv.python),
                     "--no-index", "--find-links", str(wheels), f"torch=={TORCH}", "tiny"],
                    env=venvs._env())
    cwd = root / "work"
    cwd.mkdir(exist_ok=True)
    return Scene(venv=venv, wheels=wheels, other=other, cwd=cwd)


@pytest.fixture
def scene(venvs: VenvFactory, tmp_path: Path) -> Scene:
    return make_scene(venvs, tmp_path)


def revisions(scene: Scene) -> list[dict[str, Any]]:
    proc = envguard("revisions", "--python", str(scene.venv.python), "--format", "json",
                    cwd=scene.cwd)
    assert proc.returncode == 0, proc.stderr
    return list(json.loads(proc.stdout)["revisions"])


def test_a_same_version_rebuild_is_refused_before_anything_changes(scene: Scene) -> None:
    before = hashes(scene.venv.path)
    proc = envguard("install", "--python", str(scene.venv.path), "--",
                    "uv", "pip", "install", "--no-index", "--find-links", str(scene.other),
                    "--reinstall", "servestack", cwd=scene.cwd)
    assert proc.returncode == 3, proc.stderr
    assert "torch-build-changed" in proc.stdout
    assert "! torch 2.11.0+cu128 (same version, another build" in proc.stdout
    assert "nothing was changed" in proc.stdout
    assert hashes(scene.venv.path) == before
    assert revisions(scene) == []
    assert no_copy_left(scene.venv.path)


def test_json_and_markdown_say_the_same(scene: Scene) -> None:
    args = ["install", "--dry-run", "--python", str(scene.venv.path), "--", "uv", "pip",
            "install", "--no-index", "--find-links", str(scene.other), "--reinstall",
            "servestack"]
    doc = json.loads(envguard(*args[:2], "--format", "json", *args[2:], cwd=scene.cwd).stdout)
    assert doc["refused"] is True
    assert {p["name"]: p["action"] for p in doc["packages"]} == {
        "servestack": "install", "torch": "rebuild"}
    assert "torch-build-changed" in [f["rule"] for f in doc["findings"]]
    markdown = envguard(*args[:2], "--format", "markdown", *args[2:], cwd=scene.cwd)
    assert markdown.returncode == 3
    assert "**torch-build-changed**" in markdown.stdout


def test_a_harmless_install_passes_and_is_recorded(scene: Scene) -> None:
    proc = envguard("install", "--python", str(scene.venv.path), "--", "uv", "pip", "install",
                    "--no-index", "--find-links", str(scene.wheels), "extra", cwd=scene.cwd)
    assert proc.returncode == 0, proc.stderr
    assert "+ extra 1.0" in proc.stdout
    assert "installed as predicted" in proc.stdout
    assert "extra" in fingerprints(scene.venv, scene.cwd)
    (rev,) = revisions(scene)
    assert rev["number"] == 1 and rev["kind"] == "install" and rev["exit_code"] == 0
    assert rev["changes"] == ["+extra 1.0"]
    assert rev["argv"][:3] == ["uv", "pip", "install"]


def test_an_uninstall_is_predicted_and_recorded(scene: Scene) -> None:
    before = hashes(scene.venv.path)
    dry = envguard("install", "--dry-run", "--python", str(scene.venv.path), "--",
                   "uv", "pip", "uninstall", "tiny", cwd=scene.cwd)
    assert dry.returncode == 0, dry.stderr
    assert "- tiny 1.0" in dry.stdout
    assert hashes(scene.venv.path) == before
    proc = envguard("install", "--python", str(scene.venv.path), "--", "uv", "pip",
                    "uninstall", "tiny", cwd=scene.cwd)
    assert proc.returncode == 0, proc.stderr
    assert "tiny" not in fingerprints(scene.venv, scene.cwd)
    assert revisions(scene)[0]["changes"] == ["-tiny 1.0"]


def test_yes_installs_the_refused_change_and_undo_restores_the_exact_builds(
        scene: Scene) -> None:
    first = fingerprints(scene.venv, scene.cwd)
    proc = envguard("install", "--yes", "--python", str(scene.venv.path), "--",
                    "uv", "pip", "install", "--no-index", "--find-links", str(scene.other),
                    "--reinstall", "servestack", cwd=scene.cwd)
    assert proc.returncode == 0, proc.stderr
    assert "installed as predicted (refused change taken with --yes)" in proc.stdout
    changed = fingerprints(scene.venv, scene.cwd)
    assert changed["torch"][0] == TORCH and changed["torch"][1] != first["torch"][1]
    undo = envguard("undo", "--python", str(scene.venv.path), cwd=scene.cwd)
    assert undo.returncode == 0, undo.stdout + undo.stderr
    assert "returned to revision 0 exactly" in undo.stdout
    assert "torch 2.11.0+cu128: uv cache" in undo.stdout
    assert fingerprints(scene.venv, scene.cwd) == first
    kinds = [r["kind"] for r in revisions(scene)]
    assert kinds == ["install", "undo"]


def test_an_undo_that_cannot_find_a_build_changes_nothing(scene: Scene, tmp_path: Path) -> None:
    proc = envguard("install", "--yes", "--python", str(scene.venv.path), "--",
                    "uv", "pip", "install", "--no-index", "--find-links", str(scene.other),
                    "--reinstall", "servestack", cwd=scene.cwd)
    assert proc.returncode == 0, proc.stderr
    before = hashes(scene.venv.path)
    empty = tmp_path / "empty-uv-cache"
    undo = envguard("undo", "--python", str(scene.venv.path), cwd=scene.cwd,
                    env={"UV_CACHE_DIR": str(empty)})
    assert undo.returncode == 1, undo.stdout + undo.stderr
    assert "cannot undo: no exact build of torch 2.11.0+cu128; nothing was changed" in undo.stdout
    assert hashes(scene.venv.path) == before
    assert [r["kind"] for r in revisions(scene)] == ["install"]


def test_a_lock_s_forbidden_package_is_refused_naming_the_lock(scene: Scene) -> None:
    lock = envguard("lock", "trainer", "--python", str(scene.venv.python), "--distribution",
                    "tiny", "--forbid", "servestack", cwd=scene.cwd)
    assert lock.returncode == 0, lock.stderr
    before = hashes(scene.venv.path)
    proc = envguard("install", "--python", str(scene.venv.path), "--", "uv", "pip", "install",
                    "--no-index", "--find-links", str(scene.other), "servestack", cwd=scene.cwd)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "lock trainer (" in proc.stdout and "lockfiles/trainer.toml" in proc.stdout
    assert "breaks lock trainer" in proc.stdout
    assert hashes(scene.venv.path) == before
    harmless = envguard("install", "--dry-run", "--python", str(scene.venv.path), "--", "uv",
                        "pip", "install", "--no-index", "--find-links", str(scene.wheels),
                        "extra", cwd=scene.cwd)
    assert harmless.returncode == 0, harmless.stdout + harmless.stderr


@pytest.mark.parametrize("argv", [
    ["rm", "-rf", "/"],
    ["uv", "pip", "compile", "x"],
    ["pip", "download", "x"],
    ["uv", "pip", "install", "--python", "/usr/bin/python3", "x"],
    ["pip", "install", "--target", "/tmp/x", "x"],
    ["/usr/bin/python3", "-m", "pip", "install", "x"],
    [],
])
def test_anything_else_is_refused_in_one_line(scene: Scene, argv: list[str]) -> None:
    proc = envguard("install", "--python", str(scene.venv.path), "--", *argv, cwd=scene.cwd)
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_the_api_plans_and_undoes(scene: Scene) -> None:
    import envguard

    env = dict(os.environ, UV_OFFLINE="1", UV_NO_CONFIG="1")
    before = hashes(scene.venv.path)
    plan = envguard.plan_install(
        ["uv", "pip", "install", "--no-index", "--find-links", str(scene.other), "--reinstall",
         "servestack"], python=scene.venv.path, cwd=scene.cwd, env=env)
    assert plan.refused
    assert [f.rule for f in plan.critical] == ["torch-build-changed"]
    assert {p.name: p.action for p in plan.packages} == {"servestack": "install",
                                                         "torch": "rebuild"}
    assert json.loads(envguard.format_report(plan, "json"))["refused"] is True
    assert hashes(scene.venv.path) == before
    proc = envguard_cli(scene, "--yes")
    assert proc.returncode == 0, proc.stderr
    report = envguard.undo(scene.venv.path, dry_run=True, env=env)
    assert report.ok and not report.applied
    assert [(s.name, s.source) for s in report.sources] == [("torch", "uv cache")]


def envguard_cli(scene: Scene, *flags: str) -> subprocess.CompletedProcess[str]:
    return envguard("install", *flags, "--python", str(scene.venv.path), "--", "uv", "pip",
                    "install", "--no-index", "--find-links", str(scene.other), "--reinstall",
                    "servestack", cwd=scene.cwd)


BACKEND = '''"""An in-tree build backend whose every build differs: a new token in each wheel."""
import base64, hashlib, os, zipfile


def _hash(data):
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    info = "drifty-1.0.dist-info/"
    files = {"drifty/__init__.py": ("TOKEN = %r\\n" % os.urandom(8).hex()).encode(),
             info + "METADATA": b"Metadata-Version: 2.1\\nName: drifty\\nVersion: 1.0\\n\\n",
             info + "WHEEL": (b"Wheel-Version: 1.0\\nGenerator: t\\nRoot-Is-Purelib: true\\n"
                              b"Tag: py3-none-any\\n\\n")}
    record = "".join("%s,%s,%d\\n" % (p, _hash(d), len(d)) for p, d in files.items())
    files["drifty-1.0.dist-info/RECORD"] = (record + "drifty-1.0.dist-info/RECORD,,\\n").encode()
    name = "drifty-1.0-py3-none-any.whl"
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w") as zf:
        for path, data in files.items():
            zf.writestr(path, data)
    return name
'''


def drifty_project(root: Path) -> Path:
    """``root/drifty``: a local project whose build backend (:data:`BACKEND`) makes another
    build every time it runs."""
    project = root / "drifty"
    project.mkdir()
    (project / "backend.py").write_text(BACKEND, encoding="utf-8")
    (project / "pyproject.toml").write_text(
        '[build-system]\nrequires = []\nbuild-backend = "backend"\nbackend-path = ["."]\n'
        '[project]\nname = "drifty"\nversion = "1.0"\n', encoding="utf-8")
    return project


def test_a_result_unlike_the_prediction_is_named(venvs: VenvFactory, tmp_path: Path) -> None:
    """pip builds a local project twice, once on the copy and once in the venv; this one's
    backend makes another build each time, so the result differs from the prediction."""
    scene = make_scene(venvs, tmp_path, with_pip=True)
    project = drifty_project(tmp_path)
    proc = envguard("install", "--python", str(scene.venv.path), "--", str(scene.venv.python),
                    "-m", "pip", "install", str(project), cwd=scene.cwd)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "+ drifty 1.0" in proc.stdout
    assert "installed, but not as predicted (1 difference(s))" in proc.stdout
    assert "differs: packages.drifty.fingerprint: predicted sha256:" in proc.stdout
    (rev,) = revisions(scene)
    assert rev["note"].startswith("differs from the prediction: packages.drifty.fingerprint")


def test_credentials_in_the_command_are_never_shown_or_recorded(scene: Scene) -> None:
    secret = "s3cr3tpassw0rd"
    proc = envguard("install", "--python", str(scene.venv.path), "--", "uv", "pip", "install",
                    "--extra-index-url", f"https://user:{secret}@example.invalid/simple",
                    "--find-links", str(scene.wheels), "extra", cwd=scene.cwd)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert secret not in proc.stdout + proc.stderr
    (rev,) = revisions(scene)
    assert rev["argv"][3] == "--extra-index-url" and secret not in rev["argv"][4]
    stored = Path(os.environ["ENVGUARD_CACHE_DIR"]) / "revisions"
    for folder, _, files in os.walk(stored):
        for name in files:
            assert secret not in Path(folder, name).read_text(encoding="utf-8"), name


def test_a_planted_link_in_the_revisions_refuses_before_anything_changes(
        scene: Scene, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    cache = Path(os.environ["ENVGUARD_CACHE_DIR"])
    cache.mkdir(parents=True, exist_ok=True)
    (cache / "revisions").symlink_to(elsewhere)
    before = hashes(scene.venv.path)
    proc = envguard("install", "--python", str(scene.venv.path), "--", "uv", "pip", "install",
                    "--no-index", "--find-links", str(scene.wheels), "extra", cwd=scene.cwd)
    assert proc.returncode == 5, proc.stdout + proc.stderr
    assert hashes(scene.venv.path) == before
    assert list(elsewhere.iterdir()) == []


def test_a_sync_is_predicted(scene: Scene) -> None:
    reqs = scene.cwd / "requirements.txt"
    reqs.write_text("tiny==1.0\nextra==1.0\n", encoding="utf-8")
    before = hashes(scene.venv.path)
    proc = envguard("install", "--dry-run", "--format", "json", "--python", str(scene.venv.path),
                    "--", "uv", "pip", "sync", "--no-index", "--find-links", str(scene.wheels),
                    "requirements.txt", cwd=scene.cwd)
    assert proc.returncode in (0, 3), proc.stderr
    doc = json.loads(proc.stdout)
    assert {p["name"]: p["action"] for p in doc["packages"]} == {"extra": "install",
                                                                 "torch": "remove"}
    assert hashes(scene.venv.path) == before
