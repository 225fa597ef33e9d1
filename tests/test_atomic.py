"""Atomic writes: an interrupted write never leaves a half-written or missing file."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from envguard.atomic import write_text_atomic
from envguard.errors import OutputError


def test_failed_write_keeps_the_old_file_and_leaves_no_temp(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "good.json"
    target.write_text("the good state\n")

    def broken_fsync(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", broken_fsync)
    with pytest.raises(OutputError, match="No space left on device"):
        write_text_atomic(target, "x" * 1000)
    assert target.read_text() == "the good state\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["good.json"]


def test_killed_writer_leaves_the_old_file_intact(tmp_path: Path) -> None:
    """A real process is SIGKILLed in the middle of writing 400 MB over the old file."""
    target = tmp_path / "good.json"
    target.write_text("the good state\n")
    code = (
        "import sys; from envguard.atomic import write_text_atomic\n"
        "print('go', flush=True)\n"
        "write_text_atomic(sys.argv[1], 'y' * (400 << 20))\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code, str(target)], stdout=subprocess.PIPE)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == b"go"
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        temps = [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
        if temps and temps[0].stat().st_size > 0:
            break
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    proc.stdout.close()
    assert proc.returncode == -signal.SIGKILL
    assert target.read_text() == "the good state\n"


def test_unwritable_destination_is_an_output_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(OutputError, match="cannot write"):
        write_text_atomic(blocker / "sub" / "snap.json", "{}")


def test_new_file_is_complete_and_replaces_old(tmp_path: Path) -> None:
    target = tmp_path / "a" / "b.json"
    write_text_atomic(target, "one")
    write_text_atomic(target, "two")
    assert target.read_text() == "two"
    assert oct(target.stat().st_mode & 0o777) == "0o644"
