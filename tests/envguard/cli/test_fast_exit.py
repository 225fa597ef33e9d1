"""The command line ends without the interpreter's teardown (envguard.cli.program.end_now),
but only after everything an exit does that matters. Real subprocesses."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from envguard.exitcodes import ExitCode

ENTRY = """\
import atexit, sys
from pathlib import Path
mark = Path(sys.argv[1])
atexit.register(lambda: mark.write_text("atexit ran"))
class Teardown:
    def __del__(self):
        Path("torn-down").write_text("the interpreter freed its objects")
keep = Teardown()
sys.argv = ["envguard", *sys.argv[2:]]
from envguard.cli import entry
sys.exit(entry())
"""


def _run(tmp_path: Path, *args: str, script: str = ENTRY) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", script, str(tmp_path / "mark"), *args],
                          capture_output=True, text=True, timeout=120, check=False,
                          cwd=tmp_path)


@pytest.mark.parametrize(("args", "code"), [(("--version",), ExitCode.OK),
                                            (("diff", "nothing.json"), ExitCode.USAGE),
                                            (("no-such-command",), ExitCode.USAGE)])
def test_the_exit_status_and_the_atexit_handlers_survive(tmp_path: Path, args: tuple[str, ...],
                                                         code: int) -> None:
    done = _run(tmp_path, *args)
    assert done.returncode == code, done.stderr
    assert (tmp_path / "mark").read_text() == "atexit ran"
    assert not (tmp_path / "torn-down").exists()  # no teardown: ended right after


def test_a_large_report_on_stdout_arrives_whole(tmp_path: Path) -> None:
    done = _run(tmp_path, "snapshot", "--json", "--verify", "none", "--no-project-config")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["schema"].startswith("envguard.snapshot/")
    assert len(done.stdout) > 10_000


def test_an_ordinary_exit_while_another_thread_runs(tmp_path: Path) -> None:
    """A normal exit waits for non-daemon threads: so does envguard (end_now returns)."""
    # The thread outlives main() for certain (it waits for main to return, then 0.5 s),
    # however slow the start under load: the fast exit must see it running.
    script = ENTRY.replace("from envguard.cli import entry", """\
import threading, time
import envguard.cli.program as program
returned = threading.Event()
real_main = program.main
def main(*args, **kwargs):
    try:
        return real_main(*args, **kwargs)
    finally:
        returned.set()
program.main = main
def late():
    returned.wait()
    time.sleep(0.5)
    Path("late").write_text("thread finished")
threading.Thread(target=late).start()
from envguard.cli import entry""")
    done = _run(tmp_path, "--version", script=script)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "late").read_text() == "thread finished"
    assert (tmp_path / "mark").read_text() == "atexit ran"
    assert (tmp_path / "torn-down").exists()  # the ordinary exit
