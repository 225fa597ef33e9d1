"""envguard doctor and history through the real CLI, on real uv venvs: exit codes, --fix,
libraries on LD_LIBRARY_PATH, conda's history, bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from envguard.history.collect import conda_history
from tests.wheelfactory import Venv, VenvFactory, build_wheel, fake_torch_files


def run(*args: str | Path, cwd: Path, extra: dict[str, str] | None = None
        ) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("VIRTUAL_ENV", "CONDA_PREFIX", "LD_LIBRARY_PATH", "LD_PRELOAD")}
    env.update(extra or {})
    return subprocess.run([sys.executable, "-m", "envguard", *map(str, args)], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=180, check=False)


@pytest.fixture
def env(venvs: VenvFactory, wheel_dir: Path, tmp_path: Path) -> Venv:
    made = venvs.create("job")
    venvs.uv_install(made, build_wheel(wheel_dir, "torch", "2.11.0+cu130",
                                       fake_torch_files(version="2.11.0+cu130", cuda="13.0")),
                     build_wheel(wheel_dir, "helperlib", "1.0",
                                 {"helperlib/__init__.py": "V = 1\n"}))
    return made


def _cache_env(tmp_path: Path) -> dict[str, str]:
    cache = tmp_path / "inductor"
    cache.mkdir(exist_ok=True)
    return {"TORCHINDUCTOR_CACHE_DIR": str(cache)}


def test_a_healthy_environment_exits_0_and_a_sick_one_1(env: Venv, clean_cwd: Path,
                                                        tmp_path: Path) -> None:
    healthy = run("doctor", "--python", env.python, "--format", "json", cwd=clean_cwd,
                  extra=_cache_env(tmp_path))
    assert healthy.returncode == 0, healthy.stdout + healthy.stderr
    doc = json.loads(healthy.stdout)
    assert doc["schema"] == "envguard.doctor/1" and doc["healthy"]
    assert [f["severity"] for f in doc["findings"]] == ["info"]  # the empty compile cache
    assert "envguard: environment:" in healthy.stderr
    libs = tmp_path / "cuda-12" / "lib64"
    libs.mkdir(parents=True)
    for name in ("libcudart.so.12", "libcudart.so.12.8.90", "libcublas.so.12", "README"):
        (libs / name).write_bytes(b"")
    sick = run("doctor", "--python", env.python, "--format", "markdown", cwd=clean_cwd,
               extra={**_cache_env(tmp_path), "LD_LIBRARY_PATH": f"/nonexistent:{libs}"})
    assert sick.returncode == 1, sick.stderr
    assert "(`cuda-library-shadowed`)" in sick.stdout
    doc = json.loads(run("doctor", "--python", env.python, "--format", "json", "-q",
                         cwd=clean_cwd, extra={**_cache_env(tmp_path),
                                               "LD_LIBRARY_PATH": f"/nonexistent:{libs}"}
                         ).stdout)
    (shadowed,) = [f for f in doc["findings"] if f["rule"] == "cuda-library-shadowed"]
    assert shadowed["severity"] == "warning"  # another major: replaces nothing of torch's
    assert shadowed["evidence"] == [
        f"LD_LIBRARY_PATH: {libs}/libcublas.so.12 (torch's is cublas 13)",
        f"LD_LIBRARY_PATH: {libs}/libcudart.so.12 (torch's is cudart 13)",
        f"LD_LIBRARY_PATH: {libs}/libcudart.so.12.8.90 (torch's is cudart 13)"]


def test_fix_reinstalls_an_edited_package_after_showing_the_plan(
        env: Venv, wheel_dir: Path, clean_cwd: Path, tmp_path: Path) -> None:
    edited = env.site_packages() / "helperlib" / "__init__.py"
    edited.unlink()  # a new file: uv hard-links installed files to its cache
    edited.write_text("V = 1  # patched while debugging\n")
    offline = {**_cache_env(tmp_path), "UV_OFFLINE": "1", "UV_FIND_LINKS": str(wheel_dir),
               "UV_NO_CONFIG": "1"}
    plan = run("doctor", "--python", env.python, "--fix", "--dry-run", "-q", cwd=clean_cwd,
               extra=offline)
    assert plan.returncode == 1, plan.stderr
    assert "reinstall helperlib 1.0" in plan.stderr
    # installed from a wheel file: that file is the exact build to reinstall
    assert f"--no-deps -- {wheel_dir / 'helperlib-1.0-py3-none-any.whl'}" in plan.stderr
    assert "--dry-run: nothing changed" in plan.stderr
    assert "patched" in edited.read_text()
    fixed = run("doctor", "--python", env.python, "--fix", "-q", cwd=clean_cwd, extra=offline)
    assert fixed.returncode == 0, fixed.stderr
    assert edited.read_text() == "V = 1\n"
    again = run("doctor", "--python", env.python, "-q", cwd=clean_cwd, extra=offline)
    assert again.returncode == 0, again.stdout


def test_fix_takes_uv_index_options_as_restore_does(
        env: Venv, wheel_dir: Path, clean_cwd: Path, tmp_path: Path) -> None:
    """--find-links, --index-url, --offline: passed to uv before the ``--``; envguard adds
    no index of its own then. A real offline reinstall, no UV_* variables."""
    edited = env.site_packages() / "helperlib" / "__init__.py"
    edited.unlink()
    edited.write_text("V = 1  # patched while debugging\n")
    args = ("doctor", "--python", env.python, "--fix", "-q", "--find-links", wheel_dir,
            "--offline")
    plan = run(*args, "--dry-run", cwd=clean_cwd, extra=_cache_env(tmp_path))
    assert plan.returncode == 1, plan.stderr
    assert f"--find-links {wheel_dir} --offline --" in plan.stderr, plan.stderr
    fixed = run(*args, cwd=clean_cwd, extra=_cache_env(tmp_path))
    assert fixed.returncode == 0, fixed.stderr
    assert edited.read_text() == "V = 1\n"
    usage = run("doctor", "--python", env.python, "--offline", "--find-links", "-x",
                cwd=clean_cwd)
    assert usage.returncode == 2 and len(usage.stderr.strip().splitlines()) <= 2


def test_bad_input_is_one_line_exit_2(env: Venv, clean_cwd: Path) -> None:
    for args in (("history", "--since", "soon"), ("doctor", "--dry-run"),
                 ("doctor", "--python", str(clean_cwd / "nope"))):
        proc = run(*args, cwd=clean_cwd)
        assert proc.returncode in (2, 4), (args, proc.stderr)
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert "Traceback" not in proc.stderr


def test_history_text_names_the_environment_and_its_blind_spots(env: Venv,
                                                                clean_cwd: Path) -> None:
    proc = run("history", "--python", env.python, cwd=clean_cwd)
    assert proc.returncode == 0, proc.stderr
    assert "environment created; one install: " in " ".join(proc.stdout.split())
    assert "removed packages leave no trace" in " ".join(proc.stdout.split())


CONDA_HISTORY = """\
==> 2024-03-01 10:00:00 <==
# cmd: /opt/conda/bin/conda create -n train python=3.11
+defaults::python-3.11.8-h955ad1f_0
+defaults::pip-24.0-py311h06a4308_0
==> 2024-03-05 16:30:12 <==
# cmd: /opt/conda/bin/conda install -c nvidia cudnn=8
-defaults::cudnn-9.1.0-cuda12_0
+nvidia::cudnn-8.9.7-cuda12_0
garbage line \x00 ignored
"""


def test_conda_history_becomes_one_event_per_transaction(tmp_path: Path) -> None:
    (tmp_path / "conda-meta").mkdir()
    (tmp_path / "conda-meta" / "history").write_text(CONDA_HISTORY)
    first, second = conda_history(tmp_path)
    assert first.subject.endswith("conda create -n train python=3.11")
    assert first.detail.startswith("+2: python-3.11.8")
    assert second.detail == ("+1 -1: cudnn-8.9.7-cuda12_0, cudnn-9.1.0-cuda12_0; "
                             "downgraded: cudnn 9.1.0 → 8.9.7")
    assert second.at - first.at == 4 * 86400 + 6 * 3600 + 30 * 60 + 12
    assert conda_history(tmp_path / "nowhere") == []


def test_what_a_package_states_in_its_own_version_file(venvs: VenvFactory, wheel_dir: Path,
                                                       clean_cwd: Path) -> None:
    """Real venv: jax's version.py states the oldest jaxlib it accepts, torchvision's the
    CUDA it was built for (PyPI's default build has no +cu label). The snapshot reads them
    with ast, never importing either; the doctor finds both mismatches."""
    made = venvs.create("stated")
    venvs.uv_install(
        made,
        build_wheel(wheel_dir, "torch", "2.11.0+cpu", fake_torch_files(version="2.11.0+cpu")),
        build_wheel(wheel_dir, "torchvision", "0.26.0", {
            "torchvision/__init__.py": "raise SystemExit('never imported')\n",
            "torchvision/version.py": "__version__ = '0.26.0'\ncuda = '12.8'\n"}),
        build_wheel(wheel_dir, "jax", "0.4.13", {
            "jax/__init__.py": "raise SystemExit('never imported')\n",
            "jax/version.py": "_version = '0.4.13'\n_minimum_jaxlib_version = '0.4.11'\n"}),
        build_wheel(wheel_dir, "jaxlib", "0.4.7", {"jaxlib/__init__.py": ""}))
    done = run("doctor", "--python", made.python, "--format", "json", cwd=clean_cwd)
    assert done.returncode == 1, done.stderr
    rules = {f["rule"]: f for f in json.loads(done.stdout)["findings"]}
    assert "0.4.11" in rules["jaxlib-older-than-jax-accepts"]["title"]
    assert "cu128" in rules["companion-variant-differs"]["title"]
