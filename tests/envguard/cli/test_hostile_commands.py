"""Commands that envguard looks at before it runs them: a FIFO or a device where a
console script should be is one answer ("not a Python script"), never a hang."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

_LOOK = ("import sys; from envguard.gate.launch import interpreter_of, command_interpreter; "
         "print(interpreter_of(sys.argv[1]), command_interpreter(sys.argv[1]))")


@pytest.mark.parametrize("kind", ["fifo", "zero", "loop"])
def test_a_command_that_is_no_file_is_not_python(tmp_path: Path, kind: str) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tool = bin_dir / "train-tool"
    if kind == "fifo":
        os.mkfifo(tool, 0o755)
    elif kind == "zero":
        tool.symlink_to("/dev/zero")
    else:
        tool.symlink_to(tool)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
    done = subprocess.run([sys.executable, "-c", _LOOK, "train-tool"], env=env,
                          capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["None", "None"]


def test_a_real_console_script_still_names_its_python(tmp_path: Path) -> None:
    tool = tmp_path / "tool"
    tool.write_text(f"#!{sys.executable}\nprint('hi')\n")
    tool.chmod(0o755)
    done = subprocess.run([sys.executable, "-c", _LOOK, str(tool)], capture_output=True,
                          text=True, timeout=30, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[0] == sys.executable
