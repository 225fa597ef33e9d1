"""stdout that cannot take the output: full, closed, a pipe closed early, an encoding without
``→``, a nonsensical COLUMNS. Every case is the real CLI in a subprocess (issue 22, item 8)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import IO, Any

import pytest

from envguard.exitcodes import ExitCode


@pytest.fixture(scope="module")
def snapshots(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A real snapshot of this environment, and a copy with a downgraded package (its
    text output has ``0.0.7 → 0.0.1`` and rich's box drawing) and a changed variable."""
    folder = tmp_path_factory.mktemp("stdout")
    good = folder / "good.json"
    proc = subprocess.run([sys.executable, "-m", "envguard", "snapshot", "-q", "--verify",
                           "none", "--no-cache-marker", "-o", str(good)], capture_output=True,
                          text=True, timeout=120, check=False,
                          env={**os.environ, "ENVGUARD_CACHE_DIR": str(folder / "cache")})
    assert proc.returncode == 0, proc.stderr
    data: dict[str, Any] = json.loads(good.read_text())
    data["packages"][0]["version"] = "0.0.1"
    data["environment"]["variables"]["CUDA_VISIBLE_DEVICES"] = {
        "value": "1", "masked": False, "digest": None}
    now = folder / "now.json"
    now.write_text(json.dumps(data))
    return good, now


def _diff(snaps: tuple[Path, Path], *extra: str, stdout: int | IO[Any] = subprocess.PIPE,
          env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "envguard", "diff", str(snaps[0]),
                           str(snaps[1]), *extra], stdout=stdout, stderr=subprocess.PIPE,
                          text=True, timeout=120, check=False, env={**os.environ, **(env or {})})


def _one_error_line(stderr: str) -> str:
    lines = stderr.splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("envguard: error: "), stderr
    assert "internal error" not in lines[0] and "Traceback" not in stderr
    return lines[0]


def test_a_full_stdout_is_an_output_error(snapshots: tuple[Path, Path]) -> None:
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full here")
    for fmt in ("text", "json"):
        with open("/dev/full", "w") as full:
            proc = _diff(snapshots, "--format", fmt, stdout=full)
        assert proc.returncode == ExitCode.OUTPUT_ERROR, proc.stderr
        assert "No space left on device" in _one_error_line(proc.stderr)


def test_a_closed_stdout_is_one_line_and_exit_5(snapshots: tuple[Path, Path]) -> None:
    cmd = [sys.executable, "-m", "envguard", "diff", str(snapshots[0]), str(snapshots[1])]
    proc = subprocess.run(["sh", "-c", 'exec "$@" >&-', "sh", *cmd], capture_output=True,
                          text=True, timeout=120, check=False)
    assert proc.returncode == ExitCode.OUTPUT_ERROR, proc.stderr
    assert "stdout is closed" in _one_error_line(proc.stderr)


def test_a_pipe_closed_early_is_an_output_error(snapshots: tuple[Path, Path]) -> None:
    cmd = [sys.executable, "-m", "envguard", "diff", str(snapshots[0]), str(snapshots[1]),
           "--format", "json"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    proc.stdout.close()  # the reader is gone before envguard writes
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == ExitCode.OUTPUT_ERROR, err
    _one_error_line(err)


@pytest.mark.parametrize("encoding", ["ascii", "latin-1"])
@pytest.mark.parametrize("fmt", ["text", "markdown"])
def test_a_stdout_without_unicode_gets_ascii_stand_ins(snapshots: tuple[Path, Path],
                                                      encoding: str, fmt: str) -> None:
    proc = _diff(snapshots, "--format", fmt, env={"PYTHONIOENCODING": encoding})
    assert proc.returncode == ExitCode.DRIFT, proc.stderr
    assert proc.stderr == ""
    assert " -> " in proc.stdout and "→" not in proc.stdout
    assert "0.0.1" in proc.stdout and "CUDA_VISIBLE_DEVICES" in proc.stdout.replace("\\_", "_")
    proc.stdout.encode(encoding)  # nothing it cannot hold


def test_a_utf8_stdout_keeps_the_real_symbols(snapshots: tuple[Path, Path]) -> None:
    proc = _diff(snapshots, env={"PYTHONIOENCODING": "utf-8"})
    assert proc.returncode == ExitCode.DRIFT, proc.stderr
    assert "→" in proc.stdout


def test_encodable_maps_what_envguard_draws() -> None:
    from envguard.cli.output import encodable

    assert encodable("a → b · c … ┏━┳┓ │", "ascii") == "a -> b - c ... +-++ |"
    assert encodable("torch→2.1 ünïcode 名前", "latin-1") == "torch->2.1 ünïcode ??"
    assert encodable("→", "utf-8") == "→"
    assert encodable("→", "no-such-codec") == "→"


@pytest.mark.parametrize("columns", ["0", "00", "-3", "wide", "", "99999999999"])
def test_a_nonsensical_columns_is_ignored(snapshots: tuple[Path, Path], columns: str) -> None:
    proc = _diff(snapshots, env={"COLUMNS": columns})
    assert proc.returncode == ExitCode.DRIFT, proc.stderr
    assert "CUDA_VISIBLE_DEVICES" in proc.stdout
    width = max(len(line) for line in proc.stdout.splitlines())
    assert 40 <= width <= 80, width  # rich's own default for a pipe, 80 columns


def test_a_valid_columns_still_sets_the_width(snapshots: tuple[Path, Path]) -> None:
    proc = _diff(snapshots, env={"COLUMNS": "120"})
    assert proc.returncode == ExitCode.DRIFT, proc.stderr
    assert 80 < max(len(line) for line in proc.stdout.splitlines()) <= 120


def test_the_snapshot_summary_survives_columns_0(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "envguard", "snapshot", "--verify", "none",
                           "--no-cache-marker", "-o", str(tmp_path / "s.json")],
                          capture_output=True, text=True, timeout=120, check=False,
                          env={**os.environ, "COLUMNS": "0"})
    assert proc.returncode == 0, proc.stderr
    assert "packages" in proc.stderr and "integrity" in proc.stderr
