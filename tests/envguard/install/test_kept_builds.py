"""``envguard undo`` of a build pip installed: not in uv's cache, so ``envguard install``
keeps it first (envguard/revisions/keep.py), and undo puts that exact build back.

Real venvs (the stdlib's venv with its bundled pip), real pip and uv, envguard as a real
subprocess, offline. ``tool`` 1.0 is installed by pip by name from a ``--find-links``
folder (as from an index: no direct URL recorded); it has a site-packages package, a data
file, a script of its own (``tool-1.0.data/scripts``) and a console script.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.envguard.install.test_install import envguard, fingerprints, hashes, no_copy_left
from tests.wheelfactory import Venv, VenvFactory, build_wheel, interruptible, run_checked

TOOL_FILES: dict[str, str | bytes] = {
    "tool/__init__.py": "def main():\n    return 1\n",
    "tool/blob.bin": b"\1" * 50000,
    "tool-1.0.data/scripts/tool-raw": "#!python\nprint('raw')\n",
    "tool-1.0.data/data/share/tool/notes.txt": "kept outside site-packages\n",
}


def _pip_installed(venvs: VenvFactory, tmp_path: Path, files: dict[str, str | bytes],
                   name: str = "tool") -> tuple[Venv, Path, Path]:
    """A venv where pip installed ``name`` 1.0 by name; (venv, the working folder, a
    folder offering ``name`` 2.0)."""
    wheels, other, cwd = tmp_path / "pip-wheels", tmp_path / "other", tmp_path / "work"
    cwd.mkdir()
    build_wheel(wheels, name, "1.0", files, scripts={f"{name}-cli": f"{name}:main"})
    build_wheel(other, name, "2.0", {f"{name}/__init__.py": "def main():\n    return 2\n"},
                scripts={f"{name}-cli": f"{name}:main"})
    venv = venvs.create(with_pip=True)
    run_checked([str(venv.python), "-m", "pip", "install", "--quiet", "--no-index",
                 "--find-links", str(wheels), f"{name}==1.0"], env=venvs._env())
    return venv, cwd, other


def _upgrade(venv: Venv, cwd: Path, other: Path, *flags: str,
             name: str = "tool") -> list[str]:
    return ["install", *flags, "--python", str(venv.path), "--", "uv", "pip", "install",
            "--no-index", "--find-links", str(other), f"{name}==2.0"]


def _kept_folder() -> Path:
    return Path(os.environ["ENVGUARD_CACHE_DIR"]) / "kept-builds"


def test_undo_restores_the_build_pip_installed(venvs: VenvFactory, tmp_path: Path) -> None:
    venv, cwd, other = _pip_installed(venvs, tmp_path, TOOL_FILES)
    first = fingerprints(venv, cwd)
    assert (venv.site_packages() / "tool-1.0.dist-info" / "INSTALLER").read_text() == "pip\n"
    proc = envguard(*_upgrade(venv, cwd, other, "--format", "json"), cwd=cwd)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    kept = json.loads(proc.stdout)["applied"]["kept"]
    outcomes = [(k["name"], k["version"], k["outcome"]) for k in kept]
    assert outcomes == [("tool", "1.0", "kept")], kept
    assert kept[0]["linked"] >= 4 and kept[0]["copied"] == 1  # the script: its shebang
    assert fingerprints(venv, cwd)["tool"][0] == "2.0"
    assert not (venv.path / "share" / "tool" / "notes.txt").exists()
    undo = envguard("undo", "--python", str(venv.path), cwd=cwd)
    assert undo.returncode == 0, undo.stdout + undo.stderr
    said = " ".join(undo.stdout.split())
    assert "tool 1.0: kept build" in said
    assert "returned to revision 0 exactly" in said
    assert fingerprints(venv, cwd) == first
    assert (venv.path / "share" / "tool" / "notes.txt").read_text() == (
        "kept outside site-packages\n")
    raw = venv.path / "bin" / "tool-raw"
    shebang = raw.read_text().splitlines()[0]  # the installer's own, for this venv
    assert shebang.startswith("#!") and os.path.realpath(os.path.dirname(
        shebang[2:])) == os.path.realpath(venv.path / "bin")
    assert os.access(raw, os.X_OK) and os.access(venv.path / "bin" / "tool-cli", os.X_OK)
    ran = subprocess.run([str(venv.python), "-c", "import tool; print(tool.main())"],
                         capture_output=True, text=True, check=True)
    assert ran.stdout == "1\n"


def test_an_edited_file_keeps_nothing_and_undo_changes_nothing(
        venvs: VenvFactory, tmp_path: Path) -> None:
    venv, cwd, other = _pip_installed(venvs, tmp_path, TOOL_FILES)
    with open(venv.site_packages() / "tool" / "__init__.py", "a", encoding="utf-8") as f:
        f.write("# edited by hand\n")  # in place: RECORD still gives the wheel's hash
    proc = envguard(*_upgrade(venv, cwd, other), cwd=cwd)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    said = " ".join(proc.stdout.split())
    assert "not kept for undo: tool 1.0 (tool/__init__.py no longer matches its RECORD" in said
    assert not list(_kept_folder().glob("sha256-*[0-9a-f]"))  # no folder: nothing kept
    before = hashes(venv.path)
    undo = envguard("undo", "--python", str(venv.path), cwd=cwd)
    assert undo.returncode == 1, undo.stdout + undo.stderr
    said = " ".join(undo.stdout.split())
    assert "cannot undo: no exact build of tool 1.0; nothing was changed" in said
    assert "envguard could not keep it before it was replaced: tool/__init__.py no longer " \
        "matches its RECORD" in said
    assert hashes(venv.path) == before
    revisions = json.loads(envguard("revisions", "--python", str(venv.path), "--format",
                                    "json", cwd=cwd).stdout)["revisions"]
    assert [r["kind"] for r in revisions] == ["install"]


def test_a_kept_file_changed_later_is_never_installed(venvs: VenvFactory,
                                                      tmp_path: Path) -> None:
    venv, cwd, other = _pip_installed(venvs, tmp_path, TOOL_FILES)
    proc = envguard(*_upgrade(venv, cwd, other), cwd=cwd)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (kept,) = [p for p in _kept_folder().iterdir() if p.is_dir()]
    with open(kept / "tool" / "blob.bin", "r+b") as f:
        f.write(b"\2")
    before = hashes(venv.path)
    undo = envguard("undo", "--python", str(venv.path), cwd=cwd)
    assert undo.returncode == 1, undo.stdout + undo.stderr
    said = " ".join(undo.stdout.split())
    assert "is damaged: tool/blob.bin changed since it was kept" in said
    assert hashes(venv.path) == before


def test_a_planted_link_in_the_store_refuses_before_anything_changes(
        venvs: VenvFactory, tmp_path: Path) -> None:
    venv, cwd, other = _pip_installed(venvs, tmp_path, TOOL_FILES)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    _kept_folder().parent.mkdir(parents=True, exist_ok=True)
    _kept_folder().symlink_to(elsewhere)
    before = hashes(venv.path)
    proc = envguard(*_upgrade(venv, cwd, other), cwd=cwd)
    assert proc.returncode == 5, proc.stdout + proc.stderr
    assert "never through a link" in proc.stderr
    assert hashes(venv.path) == before
    assert list(elsewhere.iterdir()) == []


def test_ctrl_c_while_builds_are_kept_leaves_the_venv_as_it_was(
        venvs: VenvFactory, tmp_path: Path) -> None:
    """Ctrl-C as soon as the keep step's temporary folder exists: the installer has not
    run, nothing is kept, no temporary or scratch copy is left."""
    files: dict[str, str | bytes] = {f"bulky/part{i:04d}.bin": b"\3" * 65536
                                     for i in range(600)}
    files["bulky/__init__.py"] = "def main():\n    return 1\n"
    venv, cwd, other = _pip_installed(venvs, tmp_path, files, name="bulky")
    before = hashes(venv.path)
    environ = dict(os.environ, UV_OFFLINE="1", UV_NO_CONFIG="1", COLUMNS="200")
    environ.pop("VIRTUAL_ENV", None)
    proc = subprocess.Popen([sys.executable, "-m", "envguard",
                             *_upgrade(venv, cwd, other, "--yes", name="bulky")],
                            cwd=cwd, env=environ, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=interruptible)
    seen, deadline = False, time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            names = os.listdir(_kept_folder())
        except FileNotFoundError:
            names = []
        if any(n.endswith(".tmp") for n in names):
            proc.send_signal(signal.SIGINT)
            seen = True
            break
        time.sleep(0.001)
    out, err = proc.communicate(timeout=120)
    if not seen:
        pytest.fail("the keep step's temporary folder was never seen: " + out + err)
    assert proc.returncode == 130, out + err
    assert hashes(venv.path) == before
    assert os.listdir(_kept_folder()) == []
    assert no_copy_left(venv.path)
    listed = envguard("revisions", "--python", str(venv.path), "--format", "json", cwd=cwd)
    assert json.loads(listed.stdout)["revisions"] == []


def test_a_copy_over_the_bound_keeps_nothing_and_says_why(venvs: VenvFactory,
                                                          tmp_path: Path) -> None:
    """In-process, with a bound of 0 bytes: the script, always copied (its shebang is given
    back as ``#!python``), passes it; nothing is kept, the reason is what undo will say."""
    from envguard.install.predict import snapshot_options
    from envguard.probe import collect
    from envguard.revisions.keep import keep_builds
    from envguard.revisions.kept import find_kept

    venv, _, _ = _pip_installed(venvs, tmp_path, TOOL_FILES)
    before = hashes(venv.path)
    snapshot = collect(snapshot_options(str(venv.python)))
    tool = snapshot.package("tool")
    assert tool is not None and tool.fingerprint
    key = "sha256-" + tool.fingerprint.split(":")[1]
    (result,) = keep_builds([tool], prefix=str(venv.path), env=os.environ, copy_limit=0)
    assert result.outcome == "not kept", result
    assert "would pass envguard's bound" in result.detail
    assert [p.name for p in _kept_folder().iterdir()] == [f"{key}.json"]
    found = find_kept(tool)
    assert found is not None and found.folder is None
    assert found.reason.startswith("envguard could not keep it before it was replaced: its "
                                   "files cannot be hard linked")
    (again,) = keep_builds([tool], prefix=str(venv.path), env=os.environ)
    assert again.outcome == "kept" and again.linked >= 4, again
    assert [p.name for p in _kept_folder().iterdir()] == [key]  # the note of the failure gone
    assert find_kept(tool) == type(found)(folder=str(_kept_folder() / key))
    assert hashes(venv.path) == before


def test_a_ctrl_c_right_after_the_temporary_folder_is_made_removes_it(
        venvs: VenvFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The window the test above hits now and then, made certain: the signal lands just
    after ``mkdir`` returns. The folder was made outside the block that removes it on an
    error, and was left in the store."""
    from envguard.install.predict import snapshot_options
    from envguard.probe import collect
    from envguard.revisions import keep

    venv, _cwd, _other = _pip_installed(venvs, tmp_path, TOOL_FILES)
    dist = collect(snapshot_options(str(venv.python))).package("tool")
    real_mkdir = os.mkdir

    def mkdir_then_interrupt(path, *args, **kwargs):  # type: ignore[no-untyped-def]
        real_mkdir(path, *args, **kwargs)
        if str(path).endswith(".tmp"):
            raise KeyboardInterrupt

    with monkeypatch.context() as patched, pytest.raises(KeyboardInterrupt):
        patched.setattr(keep.os, "mkdir", mkdir_then_interrupt)
        keep.keep_builds([dist], prefix=str(venv.path), env=os.environ)
    assert os.listdir(_kept_folder()) == []
