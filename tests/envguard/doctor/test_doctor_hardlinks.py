"""doctor on an edit shared by hard link: two real uv venvs linked from one uv cache (one
this test owns: ``uv_hardlinks``), a line appended in one. The finding says the file is
shared and gives the remedy that works (drop the package from uv's cache, then
reinstall); ``--fix`` runs it and the file really comes back. The miss: a copied install."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.wheelfactory import Venv, VenvFactory, build_wheel, fake_torch_files, run_checked

LINEAR = "torch/nn/modules/linear.py"
ORIGINAL = "class Linear:\n    pass\n"
EDIT = "Linear.debug = True  # while debugging\n"


def run(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "CONDA_PREFIX")}
    env.update({"UV_OFFLINE": "1", "UV_NO_CONFIG": "1"})
    return subprocess.run([sys.executable, "-m", "envguard", *map(str, args)], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=180, check=False)


def _scene(venvs: VenvFactory, wheel_dir: Path) -> tuple[Venv, Venv, Path]:
    """Two venvs with one torch wheel, the line appended in the first; returns the wheel."""
    wheel = build_wheel(wheel_dir, "torch", "2.11.0",
                        {**fake_torch_files(version="2.11.0"), LINEAR: ORIGINAL})
    first, second = venvs.create("first"), venvs.create("second")
    venvs.uv_install(first, wheel)
    venvs.uv_install(second, wheel)
    with open(first.site_packages() / LINEAR, "a") as fh:
        fh.write(EDIT)
    return first, second, wheel


def _finding(env: Venv, cwd: Path) -> dict[str, Any]:
    proc = run("doctor", "--python", env.python, "--format", "json", "-q", cwd=cwd)
    assert proc.returncode == 1, proc.stderr
    (found,) = [f for f in json.loads(proc.stdout)["findings"]
                if f["rule"] == "installed-files-modified"]
    return found


def test_doctor_calls_the_edit_shared_and_gives_the_remedy_that_works(
        uv_hardlinks: Path, venvs: VenvFactory, wheel_dir: Path, clean_cwd: Path) -> None:
    first, second, wheel = _scene(venvs, wheel_dir)
    (archive,) = (uv_hardlinks / "archive-v0").iterdir()
    for env in (first, second):  # the untouched venv has the edit too
        found = _finding(env, clean_cwd)
        assert found["severity"] == "critical"
        assert found["evidence"] == [
            f"torch: {LINEAR} (size; 3 hard links: uv's cache ({archive}) and 1 other "
            "path(s), venvs linked from it)"]
        assert "uv installs by hard link from its cache" in found["explanation"]
        assert found["remedy"][0] == (
            f"uv cache clean -- torch && uv pip install --reinstall --no-deps -- {wheel}"
            "  (envguard doctor --fix does it)")
    # Why: the remedy without the cache step links the same edited file back.
    run_checked([venvs.uv, "pip", "install", "--python", str(first.python), "--reinstall",
                 "--no-deps", "--no-index", "--offline", "--", str(wheel)])
    assert EDIT in (first.site_packages() / LINEAR).read_text()


def test_a_copied_install_with_an_edit_is_not_called_shared(
        venvs: VenvFactory, wheel_dir: Path, clean_cwd: Path) -> None:
    """The session's uv copies (UV_LINK_MODE=copy): the plain reinstall, no cache step."""
    first, second, wheel = _scene(venvs, wheel_dir)
    found = _finding(first, clean_cwd)
    assert found["evidence"] == [f"torch: {LINEAR} (size)"]
    assert "hard link" not in found["explanation"]
    assert found["remedy"][0] == (f"uv pip install --reinstall --no-deps -- {wheel}"
                                  "  (envguard doctor --fix does it)")
    assert run("doctor", "--python", second.python, "-q", cwd=clean_cwd).returncode == 0


def test_fix_drops_the_package_from_uvs_cache_then_reinstalls_and_the_file_comes_back(
        uv_hardlinks: Path, venvs: VenvFactory, wheel_dir: Path, clean_cwd: Path) -> None:
    first, second, _ = _scene(venvs, wheel_dir)
    plan = run("doctor", "--python", first.python, "--fix", "--dry-run", "-q", cwd=clean_cwd)
    assert plan.returncode == 1, plan.stderr
    lines = plan.stderr.splitlines()
    clean = lines.index("     uv cache clean -- torch".replace("uv", venvs.uv, 1))
    assert "drop torch from uv's cache" in lines[clean - 1]
    assert lines[clean + 2].startswith("  2. reinstall torch 2.11.0")
    assert EDIT in (first.site_packages() / LINEAR).read_text()

    fixed = run("doctor", "--python", first.python, "--fix", "-q", cwd=clean_cwd)
    assert fixed.returncode == 0, fixed.stderr
    assert (first.site_packages() / LINEAR).read_text() == ORIGINAL
    (archive,) = (uv_hardlinks / "archive-v0").iterdir()
    assert (archive / LINEAR).read_text() == ORIGINAL  # the cache holds a clean copy now
    assert run("doctor", "--python", first.python, "-q", cwd=clean_cwd).returncode == 0
    # The other venv keeps the edited inode, now its alone: a plain reinstall fixes it.
    assert EDIT in (second.site_packages() / LINEAR).read_text()
    found = _finding(second, clean_cwd)
    assert found["evidence"] == [f"torch: {LINEAR} (size)"]
    assert run("doctor", "--python", second.python, "--fix", "-q", cwd=clean_cwd
               ).returncode == 0
    assert (second.site_packages() / LINEAR).read_text() == ORIGINAL


def test_links_that_are_not_uvs_are_named_but_take_the_plain_reinstall(
        venvs: VenvFactory, wheel_dir: Path, clean_cwd: Path, tmp_path: Path) -> None:
    """pip never links; a backup made with a hard link (cp -l) shares the edit, and uv's
    cache has nothing to do with it: no cache step."""
    wheel = build_wheel(wheel_dir, "torch", "2.11.0",
                        {**fake_torch_files(version="2.11.0"), LINEAR: ORIGINAL})
    env = venvs.create("pip-made", with_pip=True)
    venvs.pip_install(env, wheel)
    edited = env.site_packages() / LINEAR
    os.link(edited, tmp_path / "linear-backup.py")
    with open(edited, "a") as fh:
        fh.write(EDIT)
    found = _finding(env, clean_cwd)
    assert found["evidence"] == [f"torch: {LINEAR} (size; 2 hard links: other paths share "
                                 "the edit)"]
    assert "cp -l" in found["explanation"] and "uv's cache" not in found["explanation"]
    assert not found["remedy"][0].startswith("uv cache clean")
