"""``envguard history`` as a timeline split at recorded runs, each install named with its
direction, on real uv venvs with a real guarded run (``envguard run``), envguard as a real
subprocess.

File times are set with ``os.utime`` rather than waited for: the install, the run and the
downgrade lie seconds apart, as they do when someone downgrades a package right after a
run. Nothing is mocked.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from envguard.history import INSTALLED, RUN, Event, group
from envguard.history.collect import conda_history
from tests.wheelfactory import Venv, VenvFactory, build_wheel, fake_torch_files

DEMO = "def main():\n    print('demo-train ran')\n    return 0\n"


def envguard(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("VIRTUAL_ENV", "CONDA_PREFIX", "ENVGUARD_VERIFIED")}
    env["TORCHINDUCTOR_CACHE_DIR"] = str(cwd / "no-inductor-cache")
    return subprocess.run([sys.executable, "-m", "envguard", *map(str, args)], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=180, check=False)


def history(env: Venv, cwd: Path, fmt: str = "json") -> Any:
    proc = envguard("history", "--python", env.python, "--format", fmt, "-q", cwd=cwd)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout) if fmt == "json" else proc.stdout


def set_time(path: Path, at: float) -> None:
    """``path`` (a file, or a folder and every file in it) modified at ``at``."""
    for item in [*path.rglob("*"), path] if path.is_dir() else [path]:
        os.utime(item, (at, at), follow_symlinks=False)


def dist_infos(env: Venv, name: str) -> list[Path]:
    return sorted(env.site_packages().glob(f"{name}-*.dist-info"))


@dataclasses.dataclass(frozen=True)
class Scene:
    env: Venv
    venvs: VenvFactory
    project: Path
    wheels: dict[str, Path]


@pytest.fixture
def scene(venvs: VenvFactory, wheel_dir: Path, tmp_path: Path) -> Scene:
    """A venv with torch, demo-train and helperlib 2.0, and a project that locks it."""
    wheels = {
        "torch": build_wheel(wheel_dir, "torch", "2.11.0+cu128", fake_torch_files()),
        "demo": build_wheel(wheel_dir, "demo-train", "1.0", {"demo_train/__init__.py": DEMO},
                            requires=("torch",), scripts={"demo-train": "demo_train:main"}),
        "helper2": build_wheel(wheel_dir, "helperlib", "2.0", {"helperlib/__init__.py": "V=2\n"}),
        "helper1": build_wheel(tmp_path / "older", "helperlib", "1.0",
                               {"helperlib/__init__.py": "V = 1\n"}),
    }
    env = venvs.create("train")
    venvs.uv_install(env, wheels["torch"], wheels["demo"], wheels["helper2"])
    project = (tmp_path / "project").resolve()
    project.mkdir()
    (project / "pyproject.toml").write_text(
        '[project]\nname = "demo-project"\nversion = "0"\ndependencies = ["torch"]\n')
    locked = envguard("lock", "demo-train", "--python", env.python, cwd=project)
    assert locked.returncode == 0, locked.stderr
    return Scene(env=env, venvs=venvs, project=project, wheels=wheels)


def guarded_run(scene: Scene) -> dict[str, Any]:
    """``envguard run -- demo-train``; its record."""
    proc = envguard("run", "--", scene.env.path / "bin" / "demo-train", cwd=scene.project)
    assert proc.returncode == 0, proc.stderr
    (record,) = (scene.project / ".envguard" / "runs").glob("*.run.json")
    data: dict[str, Any] = json.loads(record.read_text())
    return data


def iso(text: str) -> float:
    from envguard.history import parse_iso

    at = parse_iso(text)
    assert at is not None
    return at


def before_and_after(scene: Scene, run: dict[str, Any], *later: str) -> tuple[float, float]:
    """The first install 5 s before the run started, the packages ``later`` names 5 s
    after it ended (their files and their ``.dist-info``); (first, second)."""
    first, second = iso(run["started_at"]) - 5, iso(run["ended_at"]) + 5
    set_time(scene.env.path / "pyvenv.cfg", first - 20)
    set_time(scene.env.path / "bin", first)
    for name in ("torch", "demo_train", "helperlib"):
        at = second if name in later else first
        for folder in [*dist_infos(scene.env, name), scene.env.site_packages() / name]:
            if folder.exists():
                set_time(folder, at)
    return first, second


def test_a_downgrade_right_after_a_run_is_its_own_episode_named_downgraded(
        scene: Scene) -> None:
    run = guarded_run(scene)
    scene.venvs.uv_install(scene.env, scene.wheels["helper1"])
    first, second = before_and_after(scene, run, "helperlib")
    assert second - first < 30  # within one episode of the 120 s rule

    doc = history(scene.env, scene.project)
    assert doc["schema"] == "envguard.history/1"
    runs = [i for i, ep in enumerate(doc["episodes"]) if ep["run"] == run["id"]]
    assert len(runs) == 1, doc["episodes"]
    at = runs[0]
    install, ran, downgrade = doc["episodes"][at - 1], doc["episodes"][at], doc["episodes"][at + 1]
    assert "one install: demo-train 1.0, torch 2.11.0+cu128" in install["summary"]
    assert "helperlib" not in install["summary"]
    assert ran["summary"] == f"run: {run['id']} (exit 0, gate passed)"
    assert downgrade["summary"] == "downgraded: helperlib 2.0 → 1.0"
    (event,) = [e for e in doc["events"] if e["subject"] == "helperlib"]
    assert (event["kind"], event["change"], event["old"], event["version"]) == (
        "installed", "downgraded", "2.0", "1.0")
    assert abs(event["at"] - second) < 1
    assert f"per the recorded snapshots of run {run['id']} and the environment now" \
        in event["detail"]
    run_event = next(e for e in doc["events"] if e["kind"] == "run")
    assert run_event["ended_at"] == pytest.approx(iso(run["ended_at"]))

    text = " ".join(history(scene.env, scene.project, "text").split())
    assert "downgraded: helperlib 2.0 → 1.0" in text
    assert f"run: {run['id']} (exit 0, gate passed)" in text
    markdown = history(scene.env, scene.project, "markdown")
    assert "| downgraded: helperlib 2.0 → 1.0 |" in markdown


def test_without_runs_the_same_disk_is_one_episode_that_cannot_name_the_old_version(
        scene: Scene, clean_cwd: Path) -> None:
    """The miss: the same venv seen from a folder with no recorded run keeps the 120 s
    rule (one episode) and says that the disk cannot tell what helperlib replaced."""
    run = guarded_run(scene)
    scene.venvs.uv_install(scene.env, scene.wheels["helper1"])
    before_and_after(scene, run, "helperlib")
    doc = history(scene.env, clean_cwd)
    assert [ep["run"] for ep in doc["episodes"]] == [None]
    (episode,) = doc["episodes"]
    assert episode["summary"] == ("environment created; one install: demo-train 1.0, "
                                  "torch 2.11.0+cu128, helperlib 1.0")
    assert "downgraded" not in episode["summary"]
    assert {e["change"] for e in doc["events"] if e["kind"] == "installed"} == {""}
    assert all(e["old"] is None for e in doc["events"])


def test_a_package_upgraded_after_a_run_and_one_removed(scene: Scene) -> None:
    """An upgrade is named upgraded; a removal, which leaves nothing on disk, is a
    recorded change between the run and now."""
    scene.venvs.uv_install(scene.env, scene.wheels["helper1"])
    run = guarded_run(scene)
    scene.venvs.uv_install(scene.env, scene.wheels["helper2"])
    subprocess.run([scene.venvs.uv, "pip", "uninstall", "--quiet", "--python",
                    str(scene.env.python), "demo-train"], check=True, capture_output=True)
    before_and_after(scene, run, "helperlib")
    doc = history(scene.env, scene.project)
    (helper,) = [e for e in doc["events"] if e["subject"] == "helperlib"]
    assert (helper["change"], helper["old"], helper["version"]) == ("upgraded", "1.0", "2.0")
    (removed,) = [e for e in doc["events"] if e["kind"] == "recorded-change"]
    assert (removed["subject"], removed["change"], removed["old"], removed["version"]) == (
        "demo-train", "removed", "1.0", None)
    assert removed["not_before"] == pytest.approx(iso(run["started_at"]))
    summaries = " | ".join(ep["summary"] for ep in doc["episodes"])
    assert "upgraded: helperlib 1.0 → 2.0" in summaries
    assert "removed: demo-train 1.0 (between " in summaries


def test_the_same_version_from_another_build_is_named_reinstalled(scene: Scene,
                                                                  tmp_path: Path) -> None:
    run = guarded_run(scene)
    rebuilt = build_wheel(tmp_path / "rebuilt", "helperlib", "2.0",
                          {"helperlib/__init__.py": "V = 2  # rebuilt\n"})
    scene.venvs.uv_install(scene.env, rebuilt, reinstall=True)
    before_and_after(scene, run, "helperlib")
    doc = history(scene.env, scene.project)
    (helper,) = [e for e in doc["events"] if e["subject"] == "helperlib"]
    assert (helper["kind"], helper["change"], helper["old"], helper["version"]) == (
        "reinstalled", "reinstalled", "2.0", "2.0")
    assert doc["episodes"][-1]["summary"] == (
        "reinstalled: helperlib 2.0 (same version, other build)")


def test_a_run_of_another_environment_neither_splits_nor_names(
        scene: Scene, tmp_path: Path) -> None:
    """The runs recorded in the project are of ``train``; a second venv seen from the
    same folder shows none of them."""
    guarded_run(scene)
    other = scene.venvs.create("other")
    scene.venvs.uv_install(other, scene.wheels["helper1"])
    doc = history(other, scene.project)
    assert not [e for e in doc["events"] if e["kind"] == "run"]
    assert any("1 recorded run(s)" in b and "another environment" in b
               for b in doc["blind_spots"]), doc["blind_spots"]
    assert {e["change"] for e in doc["events"] if e["kind"] == "installed"} == {""}


def test_a_run_whose_snapshot_is_not_one_is_shown_but_not_compared(scene: Scene) -> None:
    run = guarded_run(scene)
    scene.venvs.uv_install(scene.env, scene.wheels["helper1"])
    before_and_after(scene, run, "helperlib")
    (stored,) = (scene.project / ".envguard" / "snapshots" / "by-digest").glob("*.json")
    stored.write_text('{"schema": "something/else"}')
    doc = history(scene.env, scene.project)
    assert [ep["run"] for ep in doc["episodes"]].count(run["id"]) == 1  # still splits
    assert {e["change"] for e in doc["events"] if e["subject"] == "helperlib"} == {""}
    assert any("1 recorded run(s) not compared" in b for b in doc["blind_spots"])


def _event(at: float, kind: str = INSTALLED, subject: str = "x", **extra: Any) -> Event:
    return Event(at=at, kind=kind, subject=subject, **extra)


def test_group_splits_at_a_run_and_keeps_what_happened_during_it() -> None:
    events = (_event(100), _event(105, RUN, "r1", ended_at=108.0),
              _event(107, "cache-written", "inductor"), _event(110, subject="y"))
    episodes = group(events)
    assert [[e.subject for e in ep.events] for ep in episodes] == [
        ["x"], ["r1", "inductor"], ["y"]]
    assert [ep.run for ep in episodes] == [None, "r1", None]
    # the miss: without the run the same events are one episode
    assert len(group(tuple(e for e in events if e.kind != RUN))) == 1


CONDA_HISTORY = """\
==> 2024-03-05 16:30:12 <==
# cmd: /opt/conda/bin/conda install -c nvidia cudnn=8 nccl
-defaults::cudnn-9.1.0-cuda12_0
+nvidia::cudnn-8.9.7-cuda12_0
-defaults::nccl-2.18.5.1-h0_0
+defaults::nccl-2.18.5.1-h1_0
-defaults::mkl-2023.1.0-h0_0
+defaults::mkl-2024.1.0-h0_0
"""


def test_a_conda_transaction_names_each_direction(tmp_path: Path) -> None:
    (tmp_path / "conda-meta").mkdir()
    (tmp_path / "conda-meta" / "history").write_text(CONDA_HISTORY)
    (event,) = conda_history(tmp_path)
    assert event.detail.endswith("; downgraded: cudnn 9.1.0 → 8.9.7; reinstalled: nccl "
                                 "2.18.5.1 (build h0_0 → h1_0); upgraded: mkl 2023.1.0 → "
                                 "2024.1.0")
    (tmp_path / "conda-meta" / "history").write_text(CONDA_HISTORY.replace(
        "-defaults::cudnn-9.1.0-cuda12_0\n", "").replace("-defaults::mkl-2023.1.0-h0_0\n", ""))
    (added,) = conda_history(tmp_path)
    assert "downgraded" not in added.detail and "upgraded" not in added.detail
