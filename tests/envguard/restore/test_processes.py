"""The process runner (``envguard.restore.build``): real subprocesses, no mocks."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from envguard.restore.build import Running, run_process

SLEEPER = [sys.executable, "-c", "import time; print('up', flush=True); time.sleep(60)"]


def test_a_process_killed_right_after_its_start_stops_at_once() -> None:
    """The process exists when ``Running`` returns: a kill straight after the start reaches
    it. A start left to the reading thread would lose this race and wait the minute out."""
    started = time.monotonic()
    job = Running(SLEEPER, timeout=None)
    job.kill()
    result = job.result()
    assert time.monotonic() - started < 20
    assert result.returncode != 0 and not result.ok


def test_a_kill_reaches_what_the_process_started(tmp_path: Path) -> None:
    """The whole process group goes: a child the shell started (holding the output pipe)
    would otherwise keep ``result`` waiting until it ends."""
    marker = tmp_path / "child-ran"
    script = f"sleep 60; touch {marker}"
    started = time.monotonic()
    job = Running(["sh", "-c", f"({script}) & wait"], timeout=None)
    time.sleep(0.2)
    job.kill()
    job.result()
    assert time.monotonic() - started < 20
    assert not marker.exists()


def test_running_keeps_the_output_tail_and_echoes_each_line() -> None:
    lines: list[str] = []
    job = Running([sys.executable, "-c", "for i in range(50): print(i)"], timeout=60,
                  echo=lines.append)
    result = job.result()
    assert result.ok
    assert lines == [str(i) for i in range(50)]
    assert result.lines == tuple(str(i) for i in range(10, 50))  # the last 40


def test_a_timeout_kills_and_says_so() -> None:
    started = time.monotonic()
    result = Running(SLEEPER, timeout=0.5).result()
    assert result.timed_out and not result.ok
    assert time.monotonic() - started < 20
    assert run_process(SLEEPER, timeout=0.5).timed_out


def test_a_program_that_cannot_start_raises_at_once(tmp_path: Path) -> None:
    with pytest.raises(OSError):
        Running([str(tmp_path / "no-such-program")], timeout=None)
    with pytest.raises(OSError):
        run_process([str(tmp_path / "no-such-program")], timeout=None)


def test_the_process_gets_its_own_environment_and_folder(tmp_path: Path) -> None:
    result = Running([sys.executable, "-c", "import os; print(os.getcwd(), os.environ['X'])"],
                     timeout=60, env={**os.environ, "X": "seen"}, cwd=str(tmp_path)).result()
    assert result.lines == (f"{os.path.realpath(tmp_path)} seen",)


def test_an_interruption_that_reaches_the_cli_kills_what_is_left(capsys) -> None:
    """A command that is interrupted before it could kill its own process (the instant
    after the start): the CLI's handler kills every process envguard started."""
    import argparse

    from envguard.cli.program import run_command
    from envguard.exitcodes import ExitCode

    started: list[Running] = []

    def handler(_args: argparse.Namespace) -> int:
        started.append(Running(SLEEPER, timeout=None))
        raise KeyboardInterrupt

    parser = argparse.ArgumentParser()
    parser.set_defaults(handler=handler)
    t0 = time.monotonic()
    assert run_command(parser, []) == ExitCode.INTERRUPTED
    assert "interrupted" in capsys.readouterr().err
    started[0].result()  # returns: the process is gone
    assert time.monotonic() - t0 < 20
    with pytest.raises(ProcessLookupError):
        os.kill(started[0]._proc.pid, 0)
