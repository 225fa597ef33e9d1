"""The public Python API, used as a training script would: ``import envguard`` only.

Real venvs built with uv from tiny wheels; a real lock written by the real CLI. Every
test also checks that the API printed nothing.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

import envguard
from tests.wheelfactory import Venv, VenvFactory, build_wheel, fake_torch_files


@pytest.fixture
def env(venvs: VenvFactory, wheel_dir: Path) -> Venv:
    build_wheel(wheel_dir, "torch", "2.11.0+cu128", fake_torch_files())
    build_wheel(wheel_dir, "helperlib", "1.0", {"helperlib/__init__.py": "V = 1\n"})
    made = venvs.create("train")
    venvs.uv_install(made, wheel_dir / "torch-2.11.0+cu128-py3-none-any.whl",
                     wheel_dir / "helperlib-1.0-py3-none-any.whl")
    return made


def _quiet(capfd: pytest.CaptureFixture[str]) -> None:
    out, err = capfd.readouterr()
    assert out == "" and err == "", (out, err)


def test_snapshot_write_read_and_the_file_digest(env: Venv, clean_cwd: Path,
                                                 capfd: pytest.CaptureFixture[str]) -> None:
    snap = envguard.snapshot(env.python, verify="hash")
    assert isinstance(snap, envguard.Snapshot)
    assert snap.torch.version == "2.11.0+cu128"
    assert snap.package("helperlib") is not None
    assert snap.interpreter.selected_by == "--python"
    path = clean_cwd / "env.json"
    path.write_text("old")
    path.chmod(0o600)
    assert snap.write(path) == path
    assert stat.S_IMODE(path.stat().st_mode) == 0o600  # an existing file keeps its mode
    assert snap.sha256 == "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()
    assert envguard.read_snapshot(path) == snap
    _quiet(capfd)


def test_in_process_means_this_process(env: Venv, clean_cwd: Path,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A training script records the environment it runs in: a stale VIRTUAL_ENV naming
    another venv, or another .venv in its folder, changes nothing (the command line's
    discovery rule is for a shell). ``python=`` still looks elsewhere."""
    project = clean_cwd / "project" / "src"
    project.mkdir(parents=True)
    (clean_cwd / "project" / ".venv").symlink_to(env.path)
    for snap in (envguard.snapshot(env={"VIRTUAL_ENV": str(env.path)}),
                 envguard.snapshot(cwd=project, env={})):
        assert Path(snap.interpreter.executable).resolve() == Path(sys.executable).resolve()
        assert snap.package("helperlib") is None
    other = envguard.snapshot(env.path)
    assert other.package("helperlib") is not None and other.torch.version == "2.11.0+cu128"
    # diagnose() and check() too: the old ones followed VIRTUAL_ENV to the other venv.
    monkeypatch.setenv("VIRTUAL_ENV", str(env.path))
    report = envguard.diagnose(verify="none")
    assert "envguard's own interpreter" in report.environment, report.environment
    assert report.snapshot.package("helperlib") is None


def test_a_script_in_another_venv_records_that_venv(env: Venv, clean_cwd: Path) -> None:
    """The API called from another environment's interpreter, with VIRTUAL_ENV pointing
    at this test's own venv: the script's environment is recorded."""
    code = ("import envguard, json; s = envguard.snapshot(); print(json.dumps([s.interpreter."
            "executable, s.package('helperlib') is not None]))")
    import packaging

    # envguard and its one import-time dependency, as an install into that venv gives them
    path = os.pathsep.join([str(Path(envguard.__file__).resolve().parent.parent),
                            str(Path(packaging.__file__).resolve().parent.parent)])
    done = subprocess.run([str(env.python), "-c", code], capture_output=True, text=True,
                          check=False, cwd=clean_cwd, timeout=120,
                          env={**os.environ, "PYTHONPATH": path,
                               "VIRTUAL_ENV": str(Path(sys.prefix))})
    assert done.returncode == 0, done.stderr
    executable, has_helper = json.loads(done.stdout)
    assert Path(executable).resolve() == Path(env.python).resolve()
    assert has_helper


def test_diff_explains_a_change_in_every_format(env: Venv, venvs: VenvFactory, wheel_dir: Path,
                                                clean_cwd: Path,
                                                capfd: pytest.CaptureFixture[str]) -> None:
    good = envguard.snapshot(env.python)
    same = envguard.diff(good, envguard.snapshot(env.python))
    assert same.equivalent and same.findings == ()
    build_wheel(wheel_dir, "helperlib", "2.0", {"helperlib/__init__.py": "V = 2\n"})
    venvs.uv_install(env, wheel_dir / "helperlib-2.0-py3-none-any.whl")
    report = envguard.diff(good, envguard.snapshot(env.python), old_name="good.json")
    assert not report.equivalent
    assert {c.key for c in report.changes.material} == {"helperlib"}
    assert report.findings and "helperlib" in report.verdict
    document = report.to_dict()
    assert document["schema"] == "envguard.diff/1" and document["old"] == "good.json"
    assert json.loads(report.to_json()) == document
    assert "helperlib" in report.to_markdown() and report.to_markdown().startswith("#")
    assert "helperlib" in report.to_text(width=100)
    _quiet(capfd)


def test_check_by_name_and_by_path(env: Venv, venvs: VenvFactory, wheel_dir: Path,
                                   clean_cwd: Path) -> None:
    project = clean_cwd / "proj"
    (project / "lockfiles").mkdir(parents=True)
    (project / "pyproject.toml").write_text(
        '[project]\nname = "train"\nversion = "0"\ndependencies = ["torch"]\n')
    lock = subprocess.run([sys.executable, "-m", "envguard", "lock", "train", "--python",
                           str(env.python)], cwd=project, capture_output=True,
                          text=True, check=False)
    assert lock.returncode == 0, lock.stderr
    deeper = project / "a" / "b"
    deeper.mkdir(parents=True)
    passed = envguard.check("train", python=env.python, cwd=deeper)  # lockfiles/ in a parent
    assert passed.passed and passed.lock_path.endswith("lockfiles/train.toml")
    by_path = envguard.check("lockfiles/train.toml", python=env.python, cwd=project)
    assert by_path.passed
    patched = env.site_packages() / "torch" / "version.py"
    text = patched.read_text()
    patched.unlink()
    patched.write_text(text.replace("2.11.0+cu128", "2.11.0+cu130"))
    failed = envguard.check(project / "lockfiles" / "train.toml", python=env.python)
    assert not failed.passed and failed.findings
    assert "torch" in envguard.format_report(failed)
    assert json.loads(envguard.format_report(failed, "json"))["equivalent"] is False


def test_bad_input_is_one_error_never_a_traceback(tmp_path: Path) -> None:
    from envguard.errors import EnvguardError, InputError

    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(InputError, match=r"bad\.json"):
        envguard.read_snapshot(bad)
    with pytest.raises(InputError, match="verify"):
        envguard.snapshot(verify="sha1")  # type: ignore[arg-type]
    with pytest.raises(EnvguardError, match="no lockfile"):
        envguard.check("nothing-here", cwd=tmp_path)
    with pytest.raises(AttributeError):
        envguard.no_such_function  # noqa: B018


def test_the_api_never_writes_into_a_compile_cache(env: Venv, clean_cwd: Path) -> None:
    cache = clean_cwd / "inductor"
    (cache / "fxgraph").mkdir(parents=True)
    (cache / "fxgraph" / "entry").write_bytes(b"x" * 100)
    before = sorted((p.relative_to(cache), p.stat().st_mtime_ns) for p in cache.rglob("*"))
    snap = envguard.snapshot(env.python, env={"TORCHINDUCTOR_CACHE_DIR": str(cache)})
    assert any(c.path == str(cache) for c in snap.caches)
    after = sorted((p.relative_to(cache), p.stat().st_mtime_ns) for p in cache.rglob("*"))
    assert before == after


def test_the_command_line_does_not_load_the_api() -> None:
    code = ("import sys, envguard.cli; assert 'envguard.api' not in sys.modules, 'loaded'; "
            "import envguard; envguard.snapshot; assert 'envguard.api' in sys.modules")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=False, env={**os.environ, "PYTHONWARNINGS": "error"})
    assert proc.returncode == 0, proc.stderr


def test_doctor_from_python(env: Venv, clean_cwd: Path, capfd: pytest.CaptureFixture[str]) -> None:
    cache = clean_cwd / "inductor"
    cache.mkdir()
    healthy = envguard.diagnose(env.python, env={"TORCHINDUCTOR_CACHE_DIR": str(cache)})
    assert isinstance(healthy, envguard.DoctorReport) and healthy.healthy
    helper = env.site_packages() / "helperlib" / "__init__.py"
    helper.unlink()
    helper.write_text("V = 2  # patched\n")
    sick = envguard.diagnose(env.python, env={"TORCHINDUCTOR_CACHE_DIR": str(cache)},
                           symptom="AttributeError: module 'helperlib' has no attribute 'W'")
    assert not sick.healthy and sick.findings[0].rule == "installed-files-modified"
    assert json.loads(envguard.format_report(sick, "json"))["schema"] == "envguard.doctor/1"
    _quiet(capfd)
