"""Conda prefixes: conda-meta records in snapshots, diff and doctor, through the real CLI.

The prefix is a real uv venv (so there is an interpreter to probe) with a ``conda-meta/``
folder written by hand, following the documented record format (name, version, build,
channel, subdir, md5, sha256, requested_spec, ``paths_data`` with ``_path``,
``path_type``, ``sha256``, ``size_in_bytes``, ``prefix_placeholder``, ``file_mode``).
Records written by a real installer (py-rattler) are in test_conda_real.py; the ones
here cover what a rattler install does not produce (a pip torch over a conda pytorch, a
history of several transactions, channel URLs of anaconda.org); the files they list are
real files in the prefix.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.wheelfactory import Venv, VenvFactory, build_wheel, fake_torch_files


def run(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("VIRTUAL_ENV", "CONDA_PREFIX", "LD_LIBRARY_PATH", "LD_PRELOAD")}
    return subprocess.run([sys.executable, "-m", "envguard", *map(str, args)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=180, check=False)


def put(prefix: Path, name: str, version: str, build: str, channel: str,
        files: dict[str, bytes], placeholder: tuple[str, ...] = ()) -> None:
    """A conda package: its files in the prefix and its conda-meta record."""
    paths = []
    for rel, data in files.items():
        (prefix / rel).parent.mkdir(parents=True, exist_ok=True)
        (prefix / rel).write_bytes(data)
        entry: dict[str, Any] = {"_path": rel, "path_type": "hardlink",
                                 "sha256": hashlib.sha256(data).hexdigest(),
                                 "size_in_bytes": len(data)}
        if rel in placeholder:  # conda rewrote the build prefix at link time
            entry.update({"prefix_placeholder": "/opt/anaconda1anaconda2anaconda3",
                          "file_mode": "text", "size_in_bytes": len(data) + 17})
        paths.append(entry)
    record = {"name": name, "version": version, "build": build, "build_number": 0,
              "channel": f"https://conda.anaconda.org/{channel}/linux-64",
              "subdir": "linux-64", "md5": "0" * 32, "sha256": "1" * 64,
              "requested_spec": name, "paths_data": {"paths_version": 1, "paths": paths},
              "files": list(files)}
    (prefix / "conda-meta").mkdir(exist_ok=True)
    (prefix / "conda-meta" / f"{name}-{version}-{build}.json").write_text(json.dumps(record))


def drop(prefix: Path, name: str) -> None:
    for record in (prefix / "conda-meta").glob(f"{name}-*.json"):
        for rel in json.loads(record.read_text())["files"]:
            (prefix / rel).unlink()
        record.unlink()


@pytest.fixture
def prefix(venvs: VenvFactory) -> Venv:
    env = venvs.create("conda-env")
    p = env.path
    put(p, "cudatoolkit", "11.8.0", "h6a678d5_0", "pkgs/main",
        {"lib/libcudart.so.11.0": b"x" * 300})
    put(p, "nccl", "2.18.5.1", "h6103f9b_0", "conda-forge",
        {"lib/libnccl.so.2": b"n" * 200, "include/nccl.h": b"h" * 50})
    put(p, "mkl", "2023.1.0", "h213fc3f_46344", "pkgs/main", {"lib/libmkl_rt.so.2": b"m" * 90})
    put(p, "libfoo", "1.0", "0", "conda-forge",
        {"etc/conda/activate.d/foo.sh": b"export FOO=/prefix\n"},
        placeholder=("etc/conda/activate.d/foo.sh",))
    (p / "conda-meta" / "history").write_text(
        "==> 2024-03-01 10:00:00 <==\n# cmd: conda create -p env cudatoolkit=11.8 nccl mkl\n"
        "+pkgs/main::cudatoolkit-11.8.0-h6a678d5_0\n+conda-forge::nccl-2.18.5.1-h6103f9b_0\n")
    return env


def test_cuda_changed_and_mkl_removed_is_not_equivalent(prefix: Venv, tmp_path: Path,
                                                       clean_cwd: Path) -> None:
    one, two, three = (tmp_path / f"{n}.json" for n in ("one", "two", "three"))
    for out in (one, two):
        assert run("snapshot", "--python", prefix.python, "-q", "-o", out,
                   cwd=clean_cwd).returncode == 0
    snap = json.loads(one.read_text())
    assert [p["name"] for p in snap["conda"]] == ["cudatoolkit", "libfoo", "mkl", "nccl"]
    cuda = snap["conda"][0]
    assert (cuda["version"], cuda["build"], cuda["channel"], cuda["files"]) == (
        "11.8.0", "h6a678d5_0", "pkgs/main", 1)
    assert not [i for i in snap["integrity"]["issues"] if i["package"].startswith("conda:")]
    same = run("diff", one, two, "--format", "json", cwd=clean_cwd)
    assert same.returncode == 0, same.stdout  # taken twice, no change: equivalent

    drop(prefix.path, "cudatoolkit")
    put(prefix.path, "cudatoolkit", "12.1.0", "h2b0f8c8_0", "pkgs/main",
        {"lib/libcudart.so.12": b"y" * 310})
    drop(prefix.path, "mkl")
    assert run("snapshot", "--python", prefix.python, "-q", "-o", three,
               cwd=clean_cwd).returncode == 0
    changed = run("diff", one, three, "--format", "json", cwd=clean_cwd)
    assert changed.returncode == 1, changed.stdout
    rules = {f["rule"]: f for f in json.loads(changed.stdout)["findings"]}
    assert rules["conda-package-changed"]["severity"] == "critical"
    assert "cudatoolkit" in rules["conda-package-changed"]["title"]
    assert rules["conda-package-removed"]["evidence"] == ["- mkl 2023.1.0"]


def test_altered_and_missing_files_but_not_a_rewritten_placeholder(
        prefix: Venv, tmp_path: Path, clean_cwd: Path) -> None:
    (prefix.path / "lib" / "libnccl.so.2").write_bytes(b"patched")
    (prefix.path / "include" / "nccl.h").unlink()
    out = tmp_path / "s.json"
    assert run("snapshot", "--python", prefix.python, "-q", "-o", out,
               cwd=clean_cwd).returncode == 0
    issues = {(i["package"], i["path"], i["problem"])
              for i in json.loads(out.read_text())["integrity"]["issues"]}
    assert issues == {("conda:nccl", "lib/libnccl.so.2", "size"),
                      ("conda:nccl", "include/nccl.h", "missing")}
    doctor = run("doctor", "--python", prefix.python, "--format", "json", "-q", cwd=clean_cwd)
    (found,) = [f for f in json.loads(doctor.stdout)["findings"]
                if f["rule"] == "installed-files-modified"]
    assert 'conda install --force-reinstall -- "nccl=2.18.5.1=h6103f9b_0"' in found["remedy"]


def test_torch_from_conda_and_pip_is_an_overlap(prefix: Venv, venvs: VenvFactory,
                                                wheel_dir: Path, clean_cwd: Path) -> None:
    put(prefix.path, "pytorch", "2.11.0", "py3.11_cuda12.8_0", "pytorch",
        {"lib/python3.11/site-packages/torch/_conda_marker": b"c"})
    venvs.uv_install(prefix, build_wheel(wheel_dir, "torch", "2.11.0+cu128", fake_torch_files()))
    doctor = run("doctor", "--python", prefix.python, "--format", "json", "-q", cwd=clean_cwd)
    rules = {f["rule"]: f for f in json.loads(doctor.stdout)["findings"]}
    assert rules["conda-pip-overlap"]["evidence"] == [
        "pytorch 2.11.0 (pytorch): a uv install of it sits on conda's record"]
    history = run("history", "--python", prefix.python, "--format", "json", "-q",
                  cwd=clean_cwd)
    conda_events = [e for e in json.loads(history.stdout)["events"] if e["kind"] == "conda"]
    assert conda_events[0]["subject"] == "conda create -p env cudatoolkit=11.8 nccl mkl"


def test_a_channel_token_never_reaches_the_snapshot(prefix: Venv, tmp_path: Path,
                                                    clean_cwd: Path) -> None:
    token = "ab-1b2c3d4e-5f60-7182-93a4-b5c6d7e8f901"
    put(prefix.path, "private-lib", "1.0", "0", f"t/{token}/acme", {"lib/libacme.so": b"a"})
    out = tmp_path / "s.json"
    assert run("snapshot", "--python", prefix.python, "-q", "-o", out,
               cwd=clean_cwd).returncode == 0
    assert token not in out.read_text()
    (pkg,) = [p for p in json.loads(out.read_text())["conda"] if p["name"] == "private-lib"]
    assert pkg["channel"] == "t/***/acme"


def test_verify_hash_finds_a_same_size_edit(prefix: Venv, tmp_path: Path,
                                            clean_cwd: Path) -> None:
    (prefix.path / "lib" / "libnccl.so.2").write_bytes(b"N" * 200)  # the recorded size
    out = tmp_path / "s.json"
    for verify, expected in (("size", set()), ("hash", {("conda:nccl", "lib/libnccl.so.2",
                                                          "hash")})):
        assert run("snapshot", "--python", prefix.python, "--verify", verify, "-q", "-o", out,
                   cwd=clean_cwd).returncode == 0
        issues = {(i["package"], i["path"], i["problem"])
                  for i in json.loads(out.read_text())["integrity"]["issues"]
                  if i["package"].startswith("conda:")}
        assert issues == expected, verify
