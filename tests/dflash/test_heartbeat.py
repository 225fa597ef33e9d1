"""dflash-train talks when nobody watches (issue 34, item 10): with stderr not a terminal
(nohup, a log file, CI) a plain line every ``--log-every-seconds`` and/or
``--log-every-steps``, through the target's pretraining as well as the training; on a
terminal, no heartbeat (the live display shows the same); under torchrun, rank 0 only.

The end-to-end tests run real tiny trainings with stderr redirected to a file.
"""

from __future__ import annotations

import io
import os
import pty
import re
import subprocess
import sys
from pathlib import Path

import pytest

from dflash.cli.heartbeat import Heartbeat, beat_line, duration, heartbeat_for
from dflash.ticks import Tick
from tests.dflash import launch

TRAIN_LINE = re.compile(
    r"^dflash-train: training step (\d+)/(\d+) \(\d+ %\)  loss \d+\.\d{4}  τ \d+\.\d\d"
    r"(  held-out τ \d+\.\d\d)?  [\d,]+ tok/s  ETA \d+(s|m\d\ds)$")
PRETRAIN_LINE = re.compile(
    r"^dflash-train: pretraining the target \(tiny-stdlib\) step (\d+)/(\d+) \(\d+ %\)  "
    r"loss \d+\.\d{4}  [\d,]+ tok/s  ETA \d+(s|m\d\ds)$")


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _tick(step: int, total: int = 10, tokens: int = 100, work: str = "training") -> Tick:
    return Tick(work=work, step=step, total=total, tokens=tokens,
                read=lambda: {"loss": 2.5, "tau": 1.75})


def test_a_line_every_n_steps_and_none_between():
    out, clock = io.StringIO(), Clock()
    beat = Heartbeat(every_seconds=0, every_steps=3, stream=out, clock=clock)
    beat(_tick(0, tokens=0))
    for step in range(1, 8):
        clock.now += 2.0
        beat(_tick(step))
    lines = out.getvalue().splitlines()
    assert [line.split()[3] for line in lines] == ["3/10", "6/10"]
    # 300 tokens in the 6 s since the start; 7 steps left at 2 s a step
    assert lines[0] == ("dflash-train: training step 3/10 (30 %)  loss 2.5000  τ 1.75  "
                        "50 tok/s  ETA 14s")


def test_a_line_when_the_interval_has_passed_and_none_before():
    out, clock = io.StringIO(), Clock()
    beat = Heartbeat(every_seconds=30, stream=out, clock=clock)
    beat(_tick(0, total=100, tokens=0))
    for step in range(1, 15):  # 28 s: nothing yet
        clock.now += 2.0
        beat(_tick(step, total=100))
    assert out.getvalue() == ""
    clock.now += 2.0
    beat(_tick(15, total=100))  # 30 s
    assert out.getvalue().splitlines() == [
        "dflash-train: training step 15/100 (15 %)  loss 2.5000  τ 1.75  50 tok/s  ETA 2m50s"]
    for step in range(16, 30):
        clock.now += 2.0
        beat(_tick(step, total=100))
    assert len(out.getvalue().splitlines()) == 1  # the interval counts from the last line


def test_the_values_are_read_only_when_a_line_is_shown():
    reads: list[int] = []
    beat = Heartbeat(every_seconds=0, every_steps=5, stream=io.StringIO(), clock=Clock())
    for step in range(1, 11):
        beat(Tick(work="training", step=step, total=10, tokens=1,
                  read=lambda s=step: reads.append(s) or {}))
    assert reads == [5, 10]  # reading may wait for the device: never at every step


def test_each_work_has_its_own_interval_and_a_line_says_only_what_it_knows():
    out, clock = io.StringIO(), Clock()
    beat = Heartbeat(every_seconds=0, every_steps=2, stream=out, clock=clock)
    work = "pretraining the target (tiny-stdlib)"
    for step in range(3):
        clock.now += 1.0
        beat(Tick(work=work, step=step, total=4, tokens=10,
                  read=lambda: {"loss": 6.25}))
    beat(_tick(0, tokens=0))
    clock.now += 4.0
    beat(_tick(1))
    clock.now += 4.0
    beat(_tick(2))
    first, second = out.getvalue().splitlines()
    assert first == f"dflash-train: {work} step 2/4 (50 %)  loss 6.2500  10 tok/s  ETA 2s"
    assert "τ" not in first  # pretraining has no acceptance length
    assert second.startswith("dflash-train: training step 2/10 (20 %)") and "ETA 32s" in second


def test_beat_line_fields():
    tick = _tick(40, total=200)
    line = beat_line(tick, {"loss": None, "tau": 2.0, "held_out_tau": 2.5,
                            "held_out_decode_tau": 1.9}, tokens_per_s=12345.6, eta_s=4000)
    assert line == ("training step 40/200 (20 %)  loss nan  τ 2.00  held-out τ 2.50  "
                    "decode τ 1.90  12,346 tok/s  ETA 1h06m")
    assert beat_line(tick, {}, tokens_per_s=None, eta_s=None) == "training step 40/200 (20 %)"
    assert [duration(s) for s in (0, 59.4, 61, 3599, 7260)] == ["0s", "59s", "1m01s",
                                                                "59m59s", "2h01m"]


def test_no_heartbeat_on_a_terminal_quiet_or_with_both_intervals_off(tmp_path: Path):
    primary, secondary = pty.openpty()  # a real terminal
    with os.fdopen(primary, "rb") as _, os.fdopen(secondary, "w") as tty, \
            open(tmp_path / "log", "w") as log:
        assert tty.isatty() and not log.isatty()
        assert heartbeat_for(quiet=False, every_seconds=30, every_steps=0, stream=tty) is None
        beat = heartbeat_for(quiet=False, every_seconds=30, every_steps=0, stream=log)
        assert isinstance(beat, Heartbeat) and beat.stream is log
        assert heartbeat_for(quiet=True, every_seconds=30, every_steps=0, stream=log) is None
        assert heartbeat_for(quiet=False, every_seconds=0, every_steps=0, stream=log) is None
        assert heartbeat_for(quiet=False, every_seconds=0, every_steps=5, stream=log)


def _small(out: Path, steps: int) -> list[str]:
    """The tiny recipe cut down; no --quiet: the heartbeat is progress."""
    return ["--unguarded", "--out", str(out), "--steps", str(steps), "--set=log_every=4",
            *[a for a in launch.SMALL if "log_every" not in a]]


def _stderr_to_file(argv: list[str], err: Path, env: dict[str, str]
                    ) -> subprocess.CompletedProcess[str]:
    with open(err, "w") as fh:
        proc = subprocess.run(argv, cwd=launch.REPO, env=env, stdout=subprocess.PIPE,
                              stderr=fh, text=True, timeout=400, check=False)
    assert proc.returncode == 0, err.read_text()[-3000:]
    return proc


@pytest.mark.slow
def test_a_real_run_with_stderr_in_a_file_says_steps_loss_tau_rate_and_eta(tmp_path: Path):
    err = tmp_path / "stderr.log"
    argv = [sys.executable, "-m", "dflash.cli.train", "--preset", "tiny",
            *_small(tmp_path / "run", 7), "--log-every-steps", "3", "--log-every-seconds", "0"]
    _stderr_to_file(argv, err, launch.env())
    beats = [m for m in map(TRAIN_LINE.match, err.read_text().splitlines()) if m]
    assert [(m.group(1), m.group(2)) for m in beats] == [("3", "7"), ("6", "7")], \
        err.read_text()


@pytest.mark.slow
def test_the_target_pretraining_talks_too(tmp_path: Path):
    # tiny-stdlib is built on first use: a cache of its own, 12 pretraining steps.
    env = {**launch.env(), "DFLASH_CACHE_DIR": str(tmp_path / "cache"),
           "DFLASH_STDLIB_STEPS": "12"}
    err = tmp_path / "stderr.log"
    argv = [sys.executable, "-m", "dflash.cli.train", "--preset", "demo",
            *_small(tmp_path / "run", 4), "--log-every-steps", "4", "--log-every-seconds", "0"]
    _stderr_to_file(argv, err, env)
    lines = err.read_text().splitlines()
    pre = [m.group(1, 2) for m in map(PRETRAIN_LINE.match, lines) if m]
    assert pre == [("4", "12"), ("8", "12"), ("12", "12")], lines
    train = [m.group(1, 2) for m in map(TRAIN_LINE.match, lines) if m]
    assert train == [("4", "4")], lines
    # inside the start phase that loads the target, before the training's lines
    begin = next(i for i, line in enumerate(lines) if line.startswith("dflash-train: loading"))
    first = next(i for i, line in enumerate(lines) if PRETRAIN_LINE.match(line))
    assert begin < first < next(i for i, line in enumerate(lines) if TRAIN_LINE.match(line))


@pytest.mark.slow
def test_under_torchrun_only_rank_0_beats(tmp_path: Path):
    err = tmp_path / "stderr.log"
    argv = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
            "--standalone", "-m", "dflash.cli.train", "--preset", "tiny",
            *_small(tmp_path / "run", 4), "--log-every-steps", "2", "--log-every-seconds", "0"]
    _stderr_to_file(argv, err, launch.env())
    beats = [m.group(1) for m in map(TRAIN_LINE.match, err.read_text().splitlines()) if m]
    assert beats == ["2", "4"], err.read_text()
