"""``envguard help TOPIC`` and "did you mean": help that travels with an install.

Real subprocesses of ``python -m envguard``; the wheel test builds envguard's own wheel
with uv and checks the manual is inside it (a tool install has no docs/ folder).
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from envguard.cli.help import TOPICS
from envguard.cli.program import COMMANDS
from envguard.exitcodes import ExitCode
from tests.conftest import UV
from tests.paths import REPO


def envguard(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "envguard", *args], capture_output=True,
                          text=True, timeout=60, check=False)


def test_every_command_is_a_topic_and_every_page_exists() -> None:
    assert set(COMMANDS) - {"help"} <= set(TOPICS)
    for page, _ in TOPICS.values():
        assert (REPO / "docs" / page).is_file(), page


def test_help_lists_topics_and_prints_a_page() -> None:
    listing = envguard("help")
    assert listing.returncode == ExitCode.OK
    assert "diff " in listing.stdout and "security " in listing.stdout
    page = envguard("help", "diff")
    assert page.returncode == ExitCode.OK
    assert page.stdout == (REPO / "docs" / "DIFF.md").read_text()


def test_an_unknown_topic_is_one_line_with_a_suggestion() -> None:
    proc = envguard("help", "lcok")
    assert proc.returncode == ExitCode.USAGE and proc.stdout == ""
    (line,) = proc.stderr.splitlines()
    assert "did you mean 'lock'?" in line


@pytest.mark.parametrize(("argv", "suggested"), [
    (["snapsot"], "'snapshot'"),
    (["diff", "--fromat", "json"], "'--format'"),
    (["cache", "sve"], "'save'"),
    (["diff", "--format", "jsn"], "'json'"),
    (["check", "x", "--strcit"], "'--strict'"),
])
def test_typos_get_did_you_mean(argv: list[str], suggested: str) -> None:
    proc = envguard(*argv)
    assert proc.returncode == ExitCode.USAGE
    (line,) = proc.stderr.splitlines()
    assert line.endswith(f"; did you mean {suggested}? (see {line.split(':')[0]} --help)"), line


@pytest.mark.parametrize("argv", [["zzzzqq"], ["diff", "--qqqqqq"]])
def test_nothing_close_suggests_nothing(argv: list[str]) -> None:
    proc = envguard(*argv)
    assert proc.returncode == ExitCode.USAGE
    assert "did you mean" not in proc.stderr


def test_a_secret_typed_as_an_option_is_not_echoed() -> None:
    proc = envguard("diff", "--token=hf_" + "Ab1" * 11)
    assert proc.returncode == ExitCode.USAGE
    assert "Ab1Ab1" not in proc.stderr


@pytest.mark.skipif(UV is None, reason="uv is not installed")
def test_the_wheel_carries_the_manual(tmp_path: Path) -> None:
    assert UV is not None
    subprocess.run([UV, "build", "--wheel", "--quiet", "--out-dir", str(tmp_path), str(REPO)],
                   check=True, capture_output=True, timeout=300)
    (wheel,) = tmp_path.glob("envguard-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for page, _ in TOPICS.values():
        assert f"envguard/docs/{page}" in names, page
