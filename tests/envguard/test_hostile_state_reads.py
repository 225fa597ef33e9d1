"""envguard's own state is never READ through a planted link either: a run record, the
last-good pointer, a recorded snapshot or a lock's snapshot that is a symlink (a cloned
repository can commit one pointing anywhere) is refused or skipped, never read; a lock
entry's ``snapshot_file`` cannot climb out of the lock's folder.

Real uv venvs from tiny wheels, envguard as a subprocess (the fixtures of
tests/envguard/test_hostile_state.py)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

from envguard.exitcodes import ExitCode
from tests.envguard.test_hostile_state import envguard_cli, lines, lock, run
from tests.envguard.test_hostile_state import good as good  # the module's fixture
from tests.envguard.test_hostile_state import project as project  # the module's fixture
from tests.wheelfactory import Venv

MARK = "OUTSIDE-THE-PROJECT-7f3a"


def _one_line_link_refusal(proc: subprocess.CompletedProcess[str]) -> None:
    err = proc.stderr
    assert proc.returncode == ExitCode.USAGE, err
    assert len(lines(err)) == 1 and "symbolic link" in err and "Traceback" not in err, err


def test_a_linked_run_record_is_not_read(project: Path, good: Venv, tmp_path: Path) -> None:
    assert lock(project, good).returncode == 0
    assert run(project, good, 0).returncode == 0
    runs = project / ".envguard" / "runs"
    record = next(p for p in runs.iterdir() if p.name.endswith(".run.json"))
    outside = tmp_path / "outside.json"
    data = json.loads(record.read_text())
    data["argv"] = [MARK]
    outside.write_text(json.dumps(data))
    planted = runs / f"29991231T000000-{record.name.split('-', 1)[1]}"
    planted.symlink_to(outside)
    listed = envguard_cli("runs", "--format", "json", cwd=project)
    assert listed.returncode == 0, listed.stderr
    assert MARK not in listed.stdout and MARK not in listed.stderr
    assert len(json.loads(listed.stdout)["runs"]) == 1, listed.stdout


def test_a_linked_last_good_pointer_is_not_followed(project: Path, good: Venv,
                                                    tmp_path: Path) -> None:
    assert lock(project, good).returncode == 0
    assert run(project, good, 0).returncode == 0
    pointer = project / ".envguard" / "runs" / "last-good.json"
    outside = tmp_path / "pointer.json"
    shutil.copy(pointer, outside)
    pointer.unlink()
    pointer.symlink_to(outside)
    proc = envguard_cli("diff", "@last-good", "@last-good", cwd=project)
    assert proc.returncode == ExitCode.USAGE, proc.stderr
    assert "@last-good" in proc.stderr and len(lines(proc.stderr)) == 1, proc.stderr


def test_a_linked_recorded_snapshot_is_not_read(project: Path, good: Venv,
                                                tmp_path: Path) -> None:
    assert lock(project, good).returncode == 0
    assert run(project, good, 0).returncode == 0
    store = project / ".envguard" / "snapshots" / "by-digest"
    snap = next(store.iterdir())
    outside = tmp_path / "snap.json"
    shutil.copy(snap, outside)
    snap.unlink()
    snap.symlink_to(outside)
    _one_line_link_refusal(envguard_cli("diff", "@last-good", "@last-good", cwd=project))


def test_a_linked_lock_snapshot_is_not_read(project: Path, good: Venv, tmp_path: Path) -> None:
    assert lock(project, good).returncode == 0
    toml = (project / "lockfiles" / "demo-train.toml").read_text()
    rel = next(ln.split('"')[1] for ln in toml.splitlines() if ln.startswith("snapshot_file"))
    planted = project / "lockfiles" / rel
    outside = tmp_path / "snap.json"
    shutil.copy(planted, outside)
    planted.unlink()
    planted.symlink_to(outside)
    _one_line_link_refusal(envguard_cli("check", "demo-train", "--strict", "--python",
                                        good.python, cwd=project))


def test_a_lock_snapshot_file_cannot_climb_out(project: Path, good: Venv) -> None:
    assert lock(project, good).returncode == 0
    path = project / "lockfiles" / "demo-train.toml"
    toml = path.read_text()
    rel = next(ln.split('"')[1] for ln in toml.splitlines() if ln.startswith("snapshot_file"))
    for bad in ("../../etc/passwd", "/etc/passwd"):
        path.write_text(toml.replace(f'"{rel}"', json.dumps(bad)))
        proc = envguard_cli("check", "demo-train", "--strict", "--python", good.python,
                            cwd=project)
        assert proc.returncode == ExitCode.USAGE, proc.stderr
        assert "snapshot_file" in proc.stderr and len(lines(proc.stderr)) == 1, proc.stderr
