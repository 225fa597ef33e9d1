"""Help text, ``-V`` and shell completion, from the real parser and real shells.

The bash completion script is sourced in a real ``bash`` with COMP_WORDS/COMP_CWORD set,
as bash's completion system sets them, and its COMPREPLY read back. zsh's completion
system (``_describe``, ``compadd``, ``_files``) only exists inside an interactive
completion; those few functions are stand-ins that print what they were given, and the
generated ``_envguard`` runs in a real ``zsh`` (skipped where zsh is not installed).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

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


def test_completion_needs_a_known_shell() -> None:
    proc = envguard("completion", "fish")
    assert proc.returncode == ExitCode.USAGE
    assert "invalid choice" in proc.stderr and len(proc.stderr.splitlines()) == 1


# ------------------------------------------------------------------------- bash

@pytest.fixture(scope="module")
def bash_script(tmp_path_factory: pytest.TempPathFactory) -> Path:
    proc = envguard("completion", "bash")
    assert proc.returncode == ExitCode.OK, proc.stderr
    path = tmp_path_factory.mktemp("completion") / "envguard.bash"
    path.write_text(proc.stdout)
    return path


def test_bash_script_is_valid_bash(bash_script: Path) -> None:
    check = subprocess.run(["bash", "-n", str(bash_script)], capture_output=True, text=True,
                           check=False)
    assert check.returncode == 0, check.stderr


def bash_complete(script: Path, *words: str, cwd: Path | None = None) -> list[str]:
    """COMPREPLY for the command line ``words`` (the last one is being completed)."""
    quoted = " ".join("'" + w.replace("'", "'\\''") + "'" for w in words)
    program = (f"source '{script}'\nCOMP_WORDS=({quoted})\nCOMP_CWORD={len(words) - 1}\n"
               "COMPREPLY=()\n_envguard\nprintf '%s\\n' \"${COMPREPLY[@]}\"\n")
    proc = subprocess.run(["bash", "--norc", "--noprofile", "-c", program], capture_output=True,
                          text=True, cwd=cwd, timeout=30, check=False)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    return [ln for ln in proc.stdout.splitlines() if ln]


def test_bash_completes_commands_options_and_choices(bash_script: Path, tmp_path: Path) -> None:
    assert bash_complete(bash_script, "envguard", "") == [
        "snapshot", "diff", "doctor", "history", "lock", "check", "run", "restore", "bisect",
        "cache", "fleet", "runs", "completion"]
    assert bash_complete(bash_script, "envguard", "sn") == ["snapshot"]
    assert bash_complete(bash_script, "envguard", "-") == ["-h", "--help", "-V", "--version"]
    assert bash_complete(bash_script, "envguard", "snapshot", "--ve") == ["--verify"]
    assert bash_complete(bash_script, "envguard", "snapshot", "--verify", "") == [
        "size", "hash", "none"]
    assert bash_complete(bash_script, "envguard", "cache", "s") == ["status", "save"]
    assert bash_complete(bash_script, "envguard", "fleet", "snapshot", "--format", "m") == [
        "markdown"]
    # Options of the command the cursor is in, after option values and positionals.
    assert "--offline" in bash_complete(bash_script, "envguard", "restore", "GOOD.json",
                                        "--python", ".venv", "--")
    assert bash_complete(bash_script, "envguard", "check", "--python", "x", "--fo") == [
        "--format"]
    assert bash_complete(bash_script, "envguard", "completion", "") == ["bash", "zsh"]
    # A value that is a path completes files.
    (tmp_path / "good.json").write_text("{}")
    assert bash_complete(bash_script, "envguard", "diff", "go", cwd=tmp_path) == ["good.json"]
    assert bash_complete(bash_script, "envguard", "snapshot", "-o", "g", cwd=tmp_path) == [
        "good.json"]


def test_bash_completes_the_command_line_of_run(bash_script: Path, tmp_path: Path) -> None:
    tool = tmp_path / "bin" / "qatool-for-completion"
    tool.parent.mkdir()
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    (tmp_path / "data.txt").write_text("")
    program = f"PATH={tool.parent}:$PATH\n"
    script = tmp_path / "with-path.bash"
    script.write_text(program + bash_script.read_text())
    assert bash_complete(script, "envguard", "run", "--", "qatool-for") == [tool.name]
    assert bash_complete(script, "envguard", "run", "--lock", "x.toml", "qatool-for") == [
        tool.name]
    # The command's own words are its business: files, never envguard's options.
    assert bash_complete(script, "envguard", "run", "--", "qatool", "da", cwd=tmp_path) == [
        "data.txt"]
    assert bash_complete(script, "envguard", "run", "--", "qatool", "--f", cwd=tmp_path) == []


# ------------------------------------------------------------------------- zsh

ZSH_STANDINS = r"""
compdef() { print -r -- "compdef $*"; }
_describe() { local -a items; items=("${(@P)4}"); print -r -- "$2: ${(j: :)${items[@]%%:*}}"; }
compadd() { [[ $1 == -- ]] && shift; print -r -- "values: $*"; }
_files() { print -r -- "files"; }
_command_names() { print -r -- "command names"; }
"""


@pytest.mark.skipif(shutil.which("zsh") is None, reason="zsh is not installed")
def test_zsh_script(tmp_path: Path) -> None:
    proc = envguard("completion", "zsh")
    assert proc.returncode == ExitCode.OK, proc.stderr
    script = tmp_path / "_envguard"
    script.write_text(proc.stdout)
    check = subprocess.run(["zsh", "-n", str(script)], capture_output=True, text=True,
                           check=False)
    assert check.returncode == 0, check.stderr

    def complete(*words: str) -> list[str]:
        quoted = " ".join("'" + w.replace("'", "'\\''") + "'" for w in words)
        program = (f"{ZSH_STANDINS}\nsource '{script}'\nwords=({quoted})\n"
                   f"CURRENT={len(words)}\n_envguard\n")
        run = subprocess.run(["zsh", "-f", "-c", program], capture_output=True, text=True,
                             timeout=30, check=False, env={**os.environ, "PATH": "/usr/bin:/bin"})
        assert run.returncode == 0 and run.stderr == "", run.stderr
        lines = run.stdout.splitlines()
        assert lines[0] == "compdef _envguard envguard"  # sourced: registered, not run
        return lines[1:]

    (commands,) = complete("envguard", "")
    assert commands.startswith("commands: snapshot diff lock check run restore cache fleet")
    (options,) = complete("envguard", "snapshot", "--")
    assert options.startswith("options: ") and "--verify" in options.split()
    assert complete("envguard", "snapshot", "--verify", "") == ["values: size hash none"]
    assert complete("envguard", "cache", "") == ["commands: status save restore mark"]
    assert complete("envguard", "diff", "") == ["files"]
    assert complete("envguard", "run", "--", "") == ["command names"]
    assert complete("envguard", "completion", "") == ["values: bash zsh"]
    # The descriptions are the options' help.
    assert "'--offline:uv" in proc.stdout
