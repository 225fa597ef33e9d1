"""``envguard history`` reads the revisions ``envguard install`` records: an install made
through it is an episode of its own, named with the exact versions it replaced (from the
revision's before and after snapshots), which the disk alone cannot tell. Real uv venvs
from tiny wheels, envguard as a real subprocess, offline."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.envguard.install.test_install import envguard
from tests.wheelfactory import Venv, VenvFactory, build_wheel, run_checked


def _history(python: Path, cwd: Path) -> dict[str, Any]:
    proc = envguard("history", "--python", str(python), "--format", "json", cwd=cwd)
    assert proc.returncode == 0, proc.stderr
    doc: dict[str, Any] = json.loads(proc.stdout)
    return doc


def _helper_events(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in doc["events"] if e["subject"] == "helperlib"]


def _helperlib_1_0(venvs: VenvFactory, tmp_path: Path) -> Venv:
    """helperlib 2.0 among the factory's wheels, and a venv holding 1.0 (from a folder of
    its own) installed by plain uv."""
    build_wheel(venvs.wheels, "helperlib", "2.0", {"helperlib/__init__.py": "V = 2\n"})
    old = tmp_path / "old"
    build_wheel(old, "helperlib", "1.0", {"helperlib/__init__.py": "V = 1\n"})
    venv = venvs.create()
    _uv_install(venvs, venv, old, "1.0")
    return venv


def _uv_install(venvs: VenvFactory, venv: Venv, folder: Path, version: str) -> None:
    run_checked([venvs.uv, "pip", "install", "--quiet", "--python", str(venv.python),
                 "--no-index", "--find-links", str(folder), f"helperlib=={version}"],
                env=venvs._env())


def test_an_install_through_envguard_is_named_from_its_revision(venvs: VenvFactory,
                                                                  tmp_path: Path) -> None:
    venv = _helperlib_1_0(venvs, tmp_path)
    cwd = tmp_path / "work"
    cwd.mkdir()
    done = envguard("install", "--python", str(venv.path), "--", "uv", "pip", "install",
                    "--no-index", "--find-links", str(venvs.wheels), "helperlib==2.0", cwd=cwd)
    assert done.returncode == 0, done.stderr
    doc = _history(venv.python, cwd)
    (revision,) = [e for e in doc["events"] if e["kind"] == "envguard-change"]
    assert revision["subject"] == "revision 1" and "uv pip install" in revision["detail"]
    (event,) = _helper_events(doc)
    assert (event["change"], event["old"], event["version"]) == ("upgraded", "1.0", "2.0")
    assert "revision 1" in event["detail"]
    (summary,) = [ep["summary"] for ep in doc["episodes"] if "(revision 1)" in ep["summary"]]
    assert "upgraded: helperlib 1.0 → 2.0" in summary, summary
    text = envguard("history", "--python", str(venv.python), cwd=cwd)
    flat = " ".join(text.stdout.split())
    assert "envguard install: uv pip install" in flat and "helperlib 1.0 → 2.0" in flat


def test_an_install_made_without_envguard_keeps_what_the_disk_says(venvs: VenvFactory,
                                                                   tmp_path: Path) -> None:
    """The miss: the same upgrade by plain uv leaves no revision, so no old version."""
    venv = _helperlib_1_0(venvs, tmp_path)
    _uv_install(venvs, venv, venvs.wheels, "2.0")
    cwd = tmp_path / "work"
    cwd.mkdir()
    doc = _history(venv.python, cwd)
    assert not any(e["kind"] == "envguard-change" for e in doc["events"])
    (event,) = _helper_events(doc)
    assert event["old"] is None and event["change"] in ("", "installed")
