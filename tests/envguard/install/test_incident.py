"""The incident, end to end, through the real CLI and real uv: an inference stack installed
into a working training venv replaced torch by another build under the same version string
and put CUDA 12 wheels beside the CUDA 13 ones. ``envguard install`` must refuse it before
anything changes; ``--yes`` takes it exactly as predicted; ``envguard undo`` puts the exact
builds back; ``envguard revisions`` lists both changes.

Fake wheels stand for the real ones (tests/wheelfactory.py): CUDA builds of torch and the
nvidia-* CUDA wheels cannot exist on this machine (no GPU, no network, gigabytes each), and
envguard never imports torch or loads a CUDA library to tell them apart anyway. What it
reads is what the fakes carry: ``torch/version.py`` (``__version__ = '2.11.0+cu130'``, the
``git_version`` that tells the two builds apart, ``cuda = '13.0'``), the RECORD of each
distribution (its build fingerprint), and the CUDA wheels' names and versions, named as
envguard's table names their families (``envguard/explain/tables.py``: unsuffixed
``nvidia-cublas 13.x`` is CUDA 13, ``nvidia-*-cu12`` is CUDA 12). The inference package is
called ``vllm`` because the serving-stack table knows that name; it is an empty fake.

In the incident the installer fetched torch again for the inference stack; with uv, whose
resolver keeps an installed torch that satisfies ``torch==2.11.0+cu130``, that is
``--reinstall-package torch``. The only torch 2.11.0+cu130 the inference index offers is
the other build, so the reinstall swaps the build under the same version string.

The whole story runs once, in a module-scoped fixture (real venvs and four envguard runs
cost tens of seconds on a slow machine); each test checks one part of what it recorded.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.envguard.install.test_install import hashes, no_copy_left
from tests.wheelfactory import VenvFactory, build_wheel, fake_torch_files, run_checked

TORCH = "2.11.0+cu130"
TRAIN_GIT = "70d99e998b4955e0049d13a98d77ae1b14db1f45"
SERVE_GIT = "5d3c1e9a" * 5
CU13 = (("nvidia-cublas", "13.0.0.19"), ("nvidia-cuda-runtime", "13.0.48"),
        ("nvidia-cudnn-cu13", "9.13.0.50"))
CU12 = (("nvidia-cublas-cu12", "12.8.4.1"), ("nvidia-cuda-runtime-cu12", "12.8.90"),
        ("nvidia-cudnn-cu12", "9.10.2.21"))
RULES = ("torch-build-changed", "cuda-build-changed", "foreign-stack-installed")
"""The diff rules that name the incident (envguard/explain/torch.py, packages.py): the same
version of torch from another build, cu12 and cu13 wheels mixed (cuda-build-changed's
"CUDA 12 and CUDA 13 wheels are mixed"), a serving stack in a training environment."""


def _cuda_wheel(folder: Path, name: str, version: str) -> Path:
    module = name.replace("-", "_")
    return build_wheel(folder, name, version, {
        f"nvidia/{module}/__init__.py": "",
        f"nvidia/{module}/lib/lib{module}.so.{version.split('.')[0]}": b"\x7fELF" + b"\0" * 64})


@dataclasses.dataclass(frozen=True)
class Incident:
    """What each step of the story printed, and the environment after it."""

    site_packages: Path
    first: dict[str, Any]
    """Every distribution's (version, fingerprint) before anything."""
    first_files: dict[str, str]
    refused: subprocess.CompletedProcess[str]
    refused_json: dict[str, Any]
    after_refusal: dict[str, Any]
    after_refusal_files: dict[str, str]
    installed: subprocess.CompletedProcess[str]
    after_install: dict[str, Any]
    undone: subprocess.CompletedProcess[str]
    after_undo: dict[str, Any]
    after_undo_files: dict[str, str]
    revisions_text: subprocess.CompletedProcess[str]
    revisions_json: dict[str, Any]


def _fingerprints(run: Any, python: Path) -> dict[str, Any]:
    proc = run("snapshot", "--python", str(python), "--json")
    assert proc.returncode == 0, proc.stderr
    return {p["name"]: (p["version"], p["fingerprint"])
            for p in json.loads(proc.stdout)["packages"]}


@pytest.fixture(scope="module")
def incident(module_venvs: VenvFactory, tmp_path_factory: pytest.TempPathFactory) -> Incident:
    root = tmp_path_factory.mktemp("incident")
    train, serve, cwd = root / "train-index", root / "serve-index", root / "work"
    cwd.mkdir()
    torch = build_wheel(train, "torch", TORCH,
                        fake_torch_files(version=TORCH, git_version=TRAIN_GIT, cuda="13.0"))
    cu13 = [_cuda_wheel(train, n, v) for n, v in CU13]
    build_wheel(serve, "torch", TORCH,
                fake_torch_files(version=TORCH, git_version=SERVE_GIT, cuda="13.0"))
    for name, version in CU12:
        _cuda_wheel(serve, name, version)
    build_wheel(serve, "vllm", "0.11.0", {"vllm/__init__.py": ""},
                requires=(f"torch=={TORCH}", *(n for n, _ in CU12)))
    venv = module_venvs.create("train")
    # by name from --find-links, as from an index: no direct URL recorded
    run_checked([module_venvs.uv, "pip", "install", "--quiet", "--python", str(venv.python),
                 "--no-index", "--find-links", str(train), f"torch=={TORCH}",
                 *(n for n, _ in CU13)], env=module_venvs._env())
    assert torch.exists() and all(w.exists() for w in cu13)
    environ = module_venvs._env()
    environ.update({"ENVGUARD_CACHE_DIR": str(root / "envguard-cache"), "COLUMNS": "200",
                    "XDG_CONFIG_HOME": str(root / "config")})

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "envguard", *args], cwd=cwd, env=environ,
                              capture_output=True, text=True, timeout=300, check=False)

    site = venv.site_packages()
    command = ["--python", str(venv.path), "--", "uv", "pip", "install", "--no-index",
               "--find-links", str(serve), "--reinstall-package", "torch", "vllm"]
    first, first_files = _fingerprints(run, venv.python), hashes(site)
    refused = run("install", *command)
    refused_json = run("install", "--format", "json", *command)
    after_refusal, after_refusal_files = _fingerprints(run, venv.python), hashes(site)
    installed = run("install", "--yes", "--format", "json", *command)
    after_install = _fingerprints(run, venv.python)
    undone = run("undo", "--python", str(venv.path))
    after_undo, after_undo_files = _fingerprints(run, venv.python), hashes(site)
    return Incident(
        site_packages=site, first=first, first_files=first_files, refused=refused,
        refused_json=json.loads(refused_json.stdout), after_refusal=after_refusal,
        after_refusal_files=after_refusal_files, installed=installed,
        after_install=after_install, undone=undone, after_undo=after_undo,
        after_undo_files=after_undo_files,
        revisions_text=run("revisions", "--python", str(venv.path)),
        revisions_json=json.loads(run("revisions", "--python", str(venv.path), "--format",
                                      "json").stdout))


def test_the_training_venv_is_what_the_incident_started_from(incident: Incident) -> None:
    assert incident.first["torch"][0] == TORCH
    assert {n for n, _ in CU13} <= set(incident.first)
    assert not {"vllm", *(n for n, _ in CU12)} & set(incident.first)


def test_the_install_is_refused_before_anything_changes_naming_the_rules(
        incident: Incident) -> None:
    proc = incident.refused
    assert proc.returncode == 3, proc.stdout + proc.stderr
    said = " ".join(proc.stdout.split())  # the terminal's width may wrap a line anywhere
    for rule in RULES:
        assert rule in said, (rule, proc.stdout)
    assert "CUDA 12 and CUDA 13 wheels are mixed in one environment" in said
    assert "inference packages went into the training environment (vllm)" in said
    assert f"! torch {TORCH} (same version, another build" in said
    assert "nothing was changed" in said
    doc = incident.refused_json
    assert doc["refused"] is True and doc["applied"] is None
    critical = {f["rule"] for f in doc["findings"] if f["severity"] == "critical"}
    assert set(RULES) <= critical, critical
    assert {p["name"]: p["action"] for p in doc["packages"]} == {
        "torch": "rebuild", "vllm": "install", **{n: "install" for n, _ in CU12}}
    # byte for byte: every distribution's build, and every file of site-packages
    assert incident.after_refusal == incident.first
    assert incident.after_refusal_files == incident.first_files
    assert no_copy_left(incident.site_packages.parents[2])


def test_yes_installs_it_exactly_as_predicted(incident: Incident) -> None:
    proc = incident.installed
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["forced"] is True and doc["refused"] is True
    assert doc["applied"]["exit_code"] == 0
    assert doc["applied"]["as_predicted"] is True and doc["applied"]["differences"] == []
    assert doc["applied"]["kept"] == []  # every replaced build is in uv's cache
    assert doc["verdict"] == "installed as predicted (refused change taken with --yes)"
    # the prediction named every package that moved, and nothing else moved
    predicted = {p["name"] for p in incident.refused_json["packages"]}
    after, first = incident.after_install, incident.first
    moved = {n for n in set(after) | set(first) if after.get(n) != first.get(n)}
    assert moved == predicted
    assert after["torch"][0] == TORCH and after["torch"][1] != first["torch"][1]


def test_undo_puts_the_exact_builds_back(incident: Incident) -> None:
    proc = incident.undone
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "returned to revision 0 exactly" in proc.stdout
    assert f"torch {TORCH}: uv cache" in proc.stdout
    assert incident.after_undo == incident.first
    assert not {"vllm", *(n for n, _ in CU12)} & set(incident.after_undo)
    # the files too: site-packages as it was, but for uv's own marks of an install
    changed = {p for p in set(incident.first_files) | set(incident.after_undo_files)
               if incident.first_files.get(p) != incident.after_undo_files.get(p)}
    assert all(p.endswith(("/RECORD", "/INSTALLER", "/REQUESTED", "/uv_cache.json"))
               or "__pycache__" in p for p in changed), sorted(changed)


def test_revisions_list_both_changes(incident: Incident) -> None:
    text = incident.revisions_text
    assert text.returncode == 0, text.stderr
    said = " ".join(text.stdout.split())
    assert "rev 1" in said and "rev 2" in said
    assert "install: uv pip install" in said and "undo: envguard undo" in said
    assert "+vllm 0.11.0" in said and "-vllm 0.11.0" in said
    revs = incident.revisions_json["revisions"]
    assert [(r["number"], r["kind"], r["exit_code"]) for r in revs] == [
        (1, "install", 0), (2, "undo", 0)]
    expected = sorted([f"+{n} {v}" for n, v in CU12] + ["+vllm 0.11.0",
                                                        f"torch {TORCH} (another build)"])
    assert sorted(revs[0]["changes"]) == expected
    assert sorted(revs[1]["changes"]) == sorted(
        [f"-{n} {v}" for n, v in CU12] + ["-vllm 0.11.0", f"torch {TORCH} (another build)"])
    assert revs[0]["argv"][:3] == ["uv", "pip", "install"]
