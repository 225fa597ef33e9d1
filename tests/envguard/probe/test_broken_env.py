"""Broken and half-installed environments: the snapshot still completes and says what is wrong."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from envguard.model import Snapshot
from envguard.probe import SnapshotOptions, collect
from tests.wheelfactory import Venv, VenvFactory, build_wheel, fake_torch_files


@pytest.fixture
def env(venvs: VenvFactory, wheel_dir: Path) -> Venv:
    env = venvs.create()
    venvs.uv_install(
        env,
        build_wheel(wheel_dir, "torch", "2.11.0+cu128", fake_torch_files()),
        build_wheel(wheel_dir, "demo", "1.0", {"demo/__init__.py": "", "demo/core.py": "x=1\n"}),
    )
    return env


def _snap(env: Venv, clean_cwd: Path) -> Snapshot:
    snapshot = collect(SnapshotOptions(python=str(env.python), cwd=clean_cwd))
    assert snapshot.validate() == snapshot
    return snapshot


def _messages(snapshot: Snapshot) -> list[str]:
    return [f"{e.section}: {e.message}" for e in snapshot.errors]


def test_healthy_venv_snapshot(env: Venv, clean_cwd: Path) -> None:
    snapshot = _snap(env, clean_cwd)
    assert snapshot.errors == []
    assert snapshot.interpreter.is_venv
    assert snapshot.interpreter.prefix == str(env.path)
    assert {"torch", "demo"} <= {p.name for p in snapshot.packages}
    assert snapshot.torch.git_version == "70d99e998b4955e0049d13a98d77ae1b14db1f45"
    assert snapshot.torch.cuda == "12.8"
    assert snapshot.package("demo") is not None
    assert snapshot.package("demo").installer == "uv"  # type: ignore[union-attr]


def test_half_installed_package(env: Venv, clean_cwd: Path) -> None:
    """The dist-info survived, the package folder did not (an interrupted uninstall)."""
    for path in (env.site_packages() / "demo").iterdir():
        path.unlink()
    (env.site_packages() / "demo").rmdir()
    snapshot = _snap(env, clean_cwd)
    missing = {i.path for i in snapshot.integrity.issues if i.problem == "missing"}
    assert missing == {"demo/__init__.py", "demo/core.py"}


def test_corrupt_metadata_and_missing_record(env: Venv, clean_cwd: Path) -> None:
    info = env.site_packages() / "demo-1.0.dist-info"
    (info / "METADATA").write_bytes(b"\xff\xfe\x00garbage")
    (info / "RECORD").unlink()
    snapshot = _snap(env, clean_cwd)
    messages = _messages(snapshot)
    assert "packages: corrupt METADATA: no Name or Version header" in messages
    assert "packages: RECORD missing" in messages
    demo = snapshot.package("demo")
    assert demo is not None and demo.version == "1.0" and demo.fingerprint is None
    assert "demo" in snapshot.integrity.without_record


def test_unreadable_metadata_file(env: Venv, clean_cwd: Path) -> None:
    info = env.site_packages() / "demo-1.0.dist-info"
    (info / "METADATA").unlink()
    (info / "METADATA").mkdir()  # reading it fails with EISDIR, a real OS error
    snapshot = _snap(env, clean_cwd)
    assert any("unreadable" in m for m in _messages(snapshot))
    assert "torch" in {p.name for p in snapshot.packages}


def test_two_copies_of_one_distribution(env: Venv, clean_cwd: Path, tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    extra = tmp_path / "extra-site"
    extra.mkdir()
    (extra / "demo-0.9.dist-info").mkdir()
    (extra / "demo-0.9.dist-info" / "METADATA").write_text("Name: demo\nVersion: 0.9\n\n")
    monkeypatch.setenv("PYTHONPATH", str(extra))
    snapshot = _snap(env, clean_cwd)
    demo = snapshot.package("demo")
    assert demo is not None and demo.version == "0.9"  # PYTHONPATH comes first, as for import
    assert demo.shadowed == [str(env.site_packages() / "demo-1.0.dist-info")]
    assert any("installed more than once" in m for m in _messages(snapshot))


def test_symlink_loop_on_sys_path(env: Venv, clean_cwd: Path, tmp_path: Path,
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    loop = tmp_path / "loop"
    os.symlink(loop, loop)
    monkeypatch.setenv("PYTHONPATH", str(loop))
    snapshot = _snap(env, clean_cwd)
    assert any(e.path == str(loop) for e in snapshot.errors), snapshot.errors
    assert snapshot.torch.version == "2.11.0+cu128"


@pytest.mark.parametrize("tmpdir_value", [None, "{tmp}", "/nonexistent/folder"])
def test_probe_tempdir_and_user_match_the_stdlib(tmpdir_value: str | None, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The probe re-implements tempfile.gettempdir and getpass.getuser to start faster."""
    import getpass
    import tempfile

    from envguard.probe import _inprocess

    if tmpdir_value is None:
        monkeypatch.delenv("TMPDIR", raising=False)
    else:
        monkeypatch.setenv("TMPDIR", tmpdir_value.format(tmp=tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", None)  # forget the stdlib's cached answer
    assert _inprocess._tempdir() == tempfile.gettempdir()
    assert _inprocess._user() == getpass.getuser()


def test_current_interpreter_is_recognised_but_not_another_venv_of_the_same_base(
    venvs: VenvFactory, tmp_path: Path
) -> None:
    import sys

    from envguard.probe.interpreter import is_current_interpreter

    assert is_current_interpreter(sys.executable)
    other = venvs.create()
    assert not is_current_interpreter(str(other.python))
    link = tmp_path / "python-link"
    link.symlink_to(sys.executable)
    assert not is_current_interpreter(str(link))  # outside the venv: runs as the base Python
