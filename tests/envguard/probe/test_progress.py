"""Long work says what it is doing: a note on a pipe, a transient display on a terminal.

The slow import is a real one: a fake torch (built by the wheel factory, installed in a
real venv) whose ``import`` sleeps, as a real torch takes 5-20 s on a cold disk. The
terminal is a real pseudo-terminal (``pty``) given to envguard as its stderr.
"""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

from envguard.cli.output import StderrProgress
from envguard.exitcodes import ExitCode
from envguard.probe.progress import NullProgress, Progress
from tests.wheelfactory import Venv, VenvFactory, build_wheel, fake_torch_files

SLOW_IMPORT_S = 4.0


@pytest.fixture
def slow_torch(venvs: VenvFactory, wheel_dir: Path) -> Venv:
    env = venvs.create("slow-torch")
    init = f"import time\ntime.sleep({SLOW_IMPORT_S})\nfrom torch.version import __version__\n"
    venvs.uv_install(env, build_wheel(wheel_dir, "torch", "2.11.0+cpu",
                                      fake_torch_files(version="2.11.0+cpu", cuda=None,
                                                       init=init)))
    return env


def _snapshot_args(env: Venv) -> list[str]:
    return [sys.executable, "-m", "envguard", "snapshot", "--json", "--deep", "--verify", "none",
            "--no-cache-marker", "--no-project-config", "--python", str(env.python)]


def test_deep_snapshot_says_it_is_importing_torch(slow_torch: Venv, clean_cwd: Path) -> None:
    """The old code sat silent while torch imported (18 s on the machine it was found on)."""
    proc = subprocess.run(_snapshot_args(slow_torch), capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.returncode == ExitCode.OK, proc.stderr
    notes = [ln for ln in proc.stderr.splitlines() if "importing torch" in ln]
    assert notes == [f"envguard: importing torch in {slow_torch.python} (--deep, at most "
                     "180 s)"], proc.stderr
    quiet = subprocess.run([*_snapshot_args(slow_torch), "-q"], capture_output=True, text=True,
                           timeout=120, check=False)
    assert quiet.returncode == ExitCode.OK and quiet.stderr == "", quiet.stderr


def test_on_a_terminal_the_step_is_shown_and_then_cleared(slow_torch: Venv,
                                                         clean_cwd: Path) -> None:
    main, child = pty.openpty()
    env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": "200"}
    proc = subprocess.Popen([*_snapshot_args(slow_torch), "-q"], stdout=subprocess.PIPE,
                            stderr=child, env=env)
    os.close(child)
    shown = b""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        ready, _, _ = select.select([main], [], [], 0.2)
        if ready:
            try:
                data = os.read(main, 65536)
            except OSError:  # the last writer closed the terminal
                break
            if not data:
                break
            shown += data
        elif proc.poll() is not None:
            break
    out, _ = proc.communicate(timeout=30)
    os.close(main)
    assert proc.returncode == ExitCode.OK, shown
    assert b'"schema": "envguard.snapshot/1"' in out
    assert b"importing torch in" in shown, shown
    assert b"envguard: importing torch" not in shown  # a display, not a note line
    assert b"\x1b[2K" in shown or b"\x1b[1A" in shown  # and it was erased again


def test_fleet_rank_0_says_it_is_waiting_for_the_others(tmp_path: Path) -> None:
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}
    proc = subprocess.run(
        [sys.executable, "-m", "envguard", "fleet", "snapshot", "--dir", str(tmp_path / "s"),
         "--timeout", "3.5", "--no-project-config", "--verify", "none"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env, check=False)
    assert proc.returncode == ExitCode.ENVIRONMENT_ERROR, proc.stderr
    lines = proc.stderr.splitlines()
    assert lines[0] == ("envguard: waiting for the snapshots of 1 other rank(s) (at most 3.5 "
                        "s)"), proc.stderr
    assert lines[1].startswith("envguard: error: ") and "timed out" in lines[1]


# ------------------------------------------------------------------------- the renderer

def test_a_step_that_ends_quickly_leaves_no_note(capsys: pytest.CaptureFixture[str]) -> None:
    with StderrProgress(note_after=0.3) as progress:
        progress.step("quick")
        progress.finish()
        progress.start("hashing installed files", 10)
        progress.advance(10)
    time.sleep(0.5)
    assert capsys.readouterr().err == ""


def test_a_long_step_leaves_one_note(capsys: pytest.CaptureFixture[str]) -> None:
    with StderrProgress(note_after=0.1) as progress:
        progress.step("importing something [slow]")
        time.sleep(0.4)
        progress.start("hashing installed files", 3_500_000)
        time.sleep(0.4)
        progress.advance(3_500_000)
    assert capsys.readouterr().err == ("envguard: importing something [slow]\n"
                                       "envguard: hashing installed files (3.5 MB)\n")


def test_quiet_and_hidden_progress_say_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    for progress in (StderrProgress(quiet=True, note_after=0), StderrProgress(shown=False,
                                                                             note_after=0)):
        with progress:
            progress.step("anything")
    with StderrProgress(note_after=0) as progress:
        progress.step("at once")
    assert capsys.readouterr().err == "envguard: at once\n"


def test_both_implementations_are_progress() -> None:
    implementations: list[Progress] = [NullProgress(), StderrProgress()]
    for progress in implementations:
        progress.step("x")
        progress.finish()
