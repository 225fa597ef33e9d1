"""The seed incident, reproduced with no good snapshot, through the real CLI.

A real uv venv gets a (fake) torch 2.11.0+cu128 and a trainer that needs it; days later
sglang and flashinfer-python go in; then torch is reinstalled under the same version
from another build; then `torch/fx/_symbolic_trace.py` is patched; then the compile
cache is deleted and recreated by a first launch. The installs run for real; their
times are then set back with ``os.utime`` (the test cannot wait three days), which is
exactly what the disk would hold.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.wheelfactory import Venv, VenvFactory, build_wheel, fake_torch_files

BAD_GIT = "70d99e998b4955e0049d13a98d77ae1b14db1f45"
GOOD_GIT = "e2b8a1c7f0d94a6b8c3e5f7a9b1d3c5e7f9a1b3c"
AGO_SETUP, AGO_SERVING, AGO_REBUILD, AGO_PATCH, AGO_CACHE = (
    3 * 86400, 2 * 3600, 50 * 60, 45 * 60, 10 * 60)
"""How long before the fixture each step happened (seconds). The times are taken when the
fixture runs, not when the module is imported: in a long suite the two are many minutes
apart, and ``--since 1h`` must still hold the reinstall of 50 minutes ago."""


@dataclass(frozen=True)
class Times:
    setup: float
    serving: float
    rebuild: float
    patch: float
    cache: float


def _times() -> Times:
    now = time.time()
    return Times(setup=now - AGO_SETUP, serving=now - AGO_SERVING, rebuild=now - AGO_REBUILD,
                 patch=now - AGO_PATCH, cache=now - AGO_CACHE)


def _age(folder: Path, at: float) -> None:
    """Set a folder and everything in it to time ``at``."""
    for path in [folder, *folder.rglob("*")]:
        os.utime(path, (at, at), follow_symlinks=False)


def _dist_info(env: Venv, name: str) -> Path:
    (found,) = env.site_packages().glob(f"{name.replace('-', '_')}-*.dist-info")
    return found


def envguard(*args: str | Path, env: dict[str, str], cwd: Path) -> Any:
    proc = subprocess.run([sys.executable, "-m", "envguard", *map(str, args)], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode in (0, 1), proc.stderr
    return json.loads(proc.stdout)


@pytest.fixture
def incident(venvs: VenvFactory, wheel_dir: Path, tmp_path: Path
             ) -> tuple[Venv, dict[str, str], Times]:
    at = _times()
    good = build_wheel(wheel_dir, "torch", "2.11.0+cu128", fake_torch_files(git_version=GOOD_GIT))
    rebuild = build_wheel(tmp_path / "rebuild", "torch", "2.11.0+cu128",
                          fake_torch_files(git_version=BAD_GIT))
    trainer = build_wheel(wheel_dir, "dflash-app", "1.0", {"dflash_app/__init__.py": ""},
                          requires=("torch",))
    serving = [build_wheel(wheel_dir, "sglang", "0.5.6", {"sglang/__init__.py": ""}),
               build_wheel(wheel_dir, "flashinfer-python", "0.5.3",
                           {"flashinfer/__init__.py": ""})]
    env = venvs.create("train")
    venvs.uv_install(env, good, trainer)
    _age(env.path, at.setup)
    venvs.uv_install(env, *serving)
    for name, package in (("sglang", "sglang"), ("flashinfer-python", "flashinfer")):
        _age(_dist_info(env, name), at.serving)
        _age(env.site_packages() / package, at.serving)
    venvs.uv_install(env, rebuild, reinstall=True)
    _age(_dist_info(env, "torch"), at.rebuild)
    _age(env.site_packages() / "torch", at.rebuild)
    patched = env.site_packages() / "torch" / "fx" / "_symbolic_trace.py"
    text = patched.read_text()
    patched.unlink()  # a new file: uv hard-links installed files to its cache
    patched.write_text(text + "_is_fx_tracing_flag = False  # debugging\n")
    os.utime(patched, (at.patch, at.patch))
    cache = tmp_path / "inductor"
    (cache / "fxgraph").mkdir(parents=True)
    (cache / "fxgraph" / "entry").write_bytes(b"x" * 64)
    _age(cache, at.cache)
    variables = {k: v for k, v in os.environ.items()
                 if k not in ("VIRTUAL_ENV", "CONDA_PREFIX", "LD_LIBRARY_PATH", "LD_PRELOAD")}
    variables.update({"TORCHINDUCTOR_CACHE_DIR": str(cache),
                      "ENVGUARD_CACHE_DIR": str(tmp_path / "envguard-cache")})
    return env, variables, at


def test_doctor_names_the_stack_the_file_and_the_cold_cache(
        incident: tuple[Venv, dict[str, str], Times], clean_cwd: Path) -> None:
    env, variables, _times_of = incident
    report = envguard("doctor", "--python", env.python, "--format", "json", "-q",
                      env=variables, cwd=clean_cwd)
    rules = {f["rule"]: f for f in report["findings"]}
    assert {"foreign-stack-installed", "installed-files-modified",
            "compile-cache-cold"} <= set(rules), sorted(rules)
    assert not report["healthy"]
    assert "flashinfer-python, sglang" in rules["foreign-stack-installed"]["title"]
    assert any("installed at" in e and "2 h before this check" in e
               for e in rules["foreign-stack-installed"]["evidence"])
    assert rules["installed-files-modified"]["evidence"] == [
        "torch: torch/fx/_symbolic_trace.py (size)"]
    assert rules["installed-files-modified"]["severity"] == "critical"
    cold = rules["compile-cache-cold"]
    assert cold["severity"] == "warning" and "recreated" in cold["title"]
    assert any("after torch was reinstalled" in e for e in cold["evidence"])
    symptom = envguard("doctor", "--python", env.python, "--format", "json", "-q",
                       "--symptom", "torch._dynamo.exc.InternalTorchDynamoError: Detected that "
                       "you are using FX to symbolically trace a dynamo-optimized function",
                       env=variables, cwd=clean_cwd)
    assert symptom["findings"][0]["rule"] in ("compile-cache-cold", "installed-files-modified")


def test_history_shows_the_install_and_the_reinstall_in_order(
        incident: tuple[Venv, dict[str, str], Times], clean_cwd: Path) -> None:
    env, variables, times = incident
    timeline = envguard("history", "--python", env.python, "--format", "json", "-q",
                        env=variables, cwd=clean_cwd)
    events = [(e["kind"], e["subject"]) for e in timeline["events"]]
    order = [events.index(("installed", "sglang")), events.index(("reinstalled", "torch")),
             events.index(("file-modified", "torch/fx/_symbolic_trace.py"))]
    assert order == sorted(order), events
    at = {(e["kind"], e["subject"]): e["at"] for e in timeline["events"]}
    assert abs(at[("installed", "sglang")] - times.serving) < 2
    assert abs(at[("reinstalled", "torch")] - times.rebuild) < 2
    summaries = [ep["summary"] for ep in timeline["episodes"]]
    assert any("one install: flashinfer-python 0.5.3, sglang 0.5.6" in s for s in summaries)
    assert any("torch 2.11.0+cu128 installed again, after 1 package(s) that require it "
               "(dflash-app)" in s for s in summaries), summaries
    recent = envguard("history", "--python", env.python, "--format", "json", "-q",
                      "--since", "1h", env=variables, cwd=clean_cwd)
    assert {e["subject"] for e in recent["events"]} >= {"torch", "torch/fx/_symbolic_trace.py"}
    assert "sglang" not in {e["subject"] for e in recent["events"]}
