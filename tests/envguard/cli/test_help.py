"""Help text and ``-V``, from the real parser (shell completion: test_completion.py)."""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Iterator

import pytest

from envguard import __version__
from envguard.cli import build_parser
from envguard.exitcodes import ExitCode


def envguard(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "envguard", *args], capture_output=True,
                          text=True, timeout=60, check=False)


def _walk(parser: argparse.ArgumentParser,
          path: str) -> Iterator[tuple[str, argparse.Action | None, str | None]]:
    """(command path, action, help) for every argument of every command, and (path of a
    sub-command, None, its help in the parent's list)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help for a in action._choices_actions}
            for name, child in action.choices.items():
                yield f"{path} {name}", None, helps.get(name)
                yield from _walk(child, f"{path} {name}")
        else:
            yield path, action, action.help


def test_every_option_of_every_command_has_help() -> None:
    """On the old code check and run showed --lock, --python and --format without help,
    lock --cache-policy, cache status --format and fleet snapshot --format too."""
    missing = []
    seen = 0
    for path, action, text in _walk(build_parser(), "envguard"):
        seen += 1
        if not text or not text.strip():
            what = "/".join(action.option_strings) or action.dest if action else "(command)"
            missing.append(f"{path}: {what}")
    assert seen > 100
    assert missing == []
    # And --help shows it (argparse prints help only for actions that have some).
    proc = envguard("check", "--help")
    assert proc.returncode == ExitCode.OK
    text = " ".join(proc.stdout.split())
    assert "--lock PATH the lockfile" in text and "--python PY check another" in text
    assert "--format {text,json,markdown} text (default)" in text


@pytest.mark.parametrize("flag", ["-V", "--version"])
def test_version_flag(flag: str) -> None:
    proc = envguard(flag)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, f"envguard {__version__}\n", "")
