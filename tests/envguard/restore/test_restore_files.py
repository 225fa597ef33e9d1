"""restore reads the new venv's files against RECORD before it says "reproduced": uv builds
the venv from its cache, by hard link (a cache this test owns: ``uv_hardlinks``), and an edit
made in any venv linked from that cache comes back in the restored one under the same
version and build. envguard runs as a real subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from envguard.exitcodes import ExitCode
from tests.wheelfactory import VenvFactory, build_wheel, fake_torch_files, run_checked

LINEAR = "torch/nn/modules/linear.py"
EDIT = "Linear.debug = True  # while debugging\n"


def envguard(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "CONDA_PREFIX")}
    env.update({"UV_OFFLINE": "1", "UV_NO_CONFIG": "1", "COLUMNS": "250"})
    return subprocess.run([sys.executable, "-m", "envguard", *map(str, args)], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=180, check=False)


def _good(venvs: VenvFactory, wheel_dir: Path, cwd: Path) -> tuple[Path, Path]:
    """A venv of torch and a tiny package, snapshotted clean (GOOD); then the line appended
    to its torch. Returns (its python, GOOD.json)."""
    good = venvs.create("good")
    venvs.uv_install(good, build_wheel(wheel_dir, "torch", "2.11.0", {
        **fake_torch_files(version="2.11.0"), LINEAR: "class Linear:\n    pass\n"}),
        build_wheel(wheel_dir, "tiny", "1.0", {"tiny/__init__.py": ""}))
    good_json = cwd / "good.json"
    assert envguard("snapshot", "-q", "--python", good.python, "-o", good_json,
                    cwd=cwd).returncode == 0
    with open(good.site_packages() / LINEAR, "a") as fh:
        fh.write(EDIT)
    return good.python, good_json


def _restore(python: Path, good_json: Path, into: Path, wheels: Path, cwd: Path,
             *more: str) -> subprocess.CompletedProcess[str]:
    return envguard("restore", good_json, "--python", python, "--into", into, "--no-index",
                    "--find-links", wheels, *more, cwd=cwd)


def test_a_hard_linked_edit_that_comes_back_is_not_called_reproduced(
        uv_hardlinks: Path, venvs: VenvFactory, wheel_dir: Path, clean_cwd: Path) -> None:
    python, good_json = _good(venvs, wheel_dir, clean_cwd)
    new = clean_cwd / "new"
    proc = _restore(python, good_json, new, wheel_dir, clean_cwd)
    assert proc.returncode == ExitCode.DRIFT, proc.stdout + proc.stderr
    (site,) = new.glob("lib/python3*/site-packages")
    assert EDIT in (site / LINEAR).read_text()  # the scene is real: the edit came back
    out = " ".join(proc.stdout.split())
    assert "reproduced exactly" not in out
    assert f"files: torch 2.11.0: 1 installed file(s) differ from RECORD: {LINEAR} (size; " \
           "3 hard links: uv's cache (" in out
    assert "Drop it from the cache: uv cache clean -- torch, then restore again" in out

    doc = json.loads(_restore(python, good_json, clean_cwd / "again", wheel_dir, clean_cwd,
                              "--format", "json").stdout)
    (files,) = doc["verification"]["unreproduced"]
    assert (doc["verification"]["ok"], files["name"], files["problem"]) == (False, "torch",
                                                                           "files")
    # The remedy it names works: with torch dropped from the cache, the restore is exact.
    run_checked([venvs.uv, "cache", "clean", "--", "torch"])
    fixed = _restore(python, good_json, clean_cwd / "fixed", wheel_dir, clean_cwd)
    assert fixed.returncode == ExitCode.OK, fixed.stdout + fixed.stderr
    assert "the package set is reproduced exactly (versions, builds and files)" in " ".join(
        fixed.stdout.split())


def test_an_edit_in_a_copied_install_stays_there_and_the_restore_is_exact(
        venvs: VenvFactory, wheel_dir: Path, clean_cwd: Path) -> None:
    """The miss: the same restore with the session's uv, which copies (UV_LINK_MODE=copy,
    its own cache): the edit in the good venv never reached the cache."""
    python, good_json = _good(venvs, wheel_dir, clean_cwd)
    proc = _restore(python, good_json, clean_cwd / "new", wheel_dir, clean_cwd)
    assert proc.returncode == ExitCode.OK, proc.stdout + proc.stderr
    assert "reproduced exactly (versions, builds and files)" in " ".join(proc.stdout.split())
