"""diff on an edit shared by hard link: two real uv venvs linked from one uv cache (one this
test owns: ``uv_hardlinks``), a line appended in the first. The diff of the *second* venv,
which nobody touched, shows the edit as shared, with the remedy that works; the miss, a
copied install, keeps the plain reinstall."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.conftest import venv_factory
from tests.wheelfactory import VenvFactory, build_wheel, fake_torch_files

LINEAR = "torch/nn/modules/linear.py"


def envguard(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "CONDA_PREFIX")}
    return subprocess.run([sys.executable, "-m", "envguard", *map(str, args)], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=180, check=False)


def _edited_diff(venvs: VenvFactory, wheel_dir: Path, cwd: Path,
                 watched: str) -> dict[str, Any] | None:
    """The ``watched`` venv's installed-files-modified finding across an edit made in the
    first one (None: the diff finds nothing)."""
    wheel = build_wheel(wheel_dir, "torch", "2.11.0",
                        {**fake_torch_files(version="2.11.0"), LINEAR: "class Linear:\n"})
    made = {name: venvs.create(name) for name in ("first", "second")}
    for env in made.values():
        venvs.uv_install(env, wheel)
    before, after = cwd / "before.json", cwd / "after.json"
    python = made[watched].python
    assert envguard("snapshot", "-q", "--python", python, "-o", before, cwd=cwd).returncode == 0
    with open(made["first"].site_packages() / LINEAR, "a") as fh:
        fh.write("Linear.debug = True\n")
    assert envguard("snapshot", "-q", "--python", python, "-o", after, cwd=cwd).returncode == 0
    proc = envguard("diff", before, after, "--format", "json", cwd=cwd)
    found = [f for f in json.loads(proc.stdout)["findings"]
             if f["rule"] == "installed-files-modified"]
    assert proc.returncode == (1 if found else 0), proc.stderr
    return found[0] if found else None


def test_the_untouched_venv_shows_the_edit_as_shared_with_the_working_remedy(
        uv_hardlinks: Path, venvs: VenvFactory, wheel_dir: Path, clean_cwd: Path) -> None:
    found = _edited_diff(venvs, wheel_dir, clean_cwd, "second")
    assert found is not None
    (archive,) = (uv_hardlinks / "archive-v0").iterdir()
    assert found["evidence"] == [
        f"torch: {LINEAR} (size; 3 hard links: uv's cache ({archive}) and 1 other path(s), "
        "venvs linked from it)"]
    assert "A reinstall alone links the same edited file back" in found["explanation"]
    assert found["remedy"][0] == ('uv cache clean -- torch && uv pip install --reinstall '
                                  '--no-deps -- "torch==2.11.0"')


def test_a_copied_install_keeps_the_plain_reinstall(
        venvs: VenvFactory, wheel_dir: Path, clean_cwd: Path, tmp_path: Path) -> None:
    """The session's uv copies (UV_LINK_MODE=copy): the first venv's edit is its own, and
    the second venv does not change at all."""
    found = _edited_diff(venvs, wheel_dir, clean_cwd, "first")
    assert found is not None
    assert found["evidence"] == [f"torch: {LINEAR} (size)"]
    assert "hard link" not in found["explanation"]
    assert found["remedy"][0] == 'uv pip install --reinstall --no-deps -- "torch==2.11.0"'
    again = venv_factory(tmp_path / "again")
    assert _edited_diff(again, again.wheels, clean_cwd, "second") is None
