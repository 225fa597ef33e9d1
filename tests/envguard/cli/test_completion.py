"""``envguard completion bash|zsh|fish``, completed by the real shells.

Three ways, from the most real: an interactive ``bash`` or ``zsh`` on a pseudo-terminal,
where TAB (or readline's insert-completions, which types every candidate into the line)
completes what was typed and a key bound to print the line reads the result back
(:func:`typed`); bash's completion function called with ``COMP_WORDS`` split as bash
splits them, at ``@``, ``:`` and ``=`` too, and its ``COMPREPLY`` read back
(:func:`bash_complete`); fish's own engine (``complete -C``). zsh's lists are read with
stand-ins for ``compadd``, ``_describe`` and ``_files``, which exist only inside a live
completion. A shell that is not installed skips its live tests, and its script is still
checked as text (:func:`test_zsh_and_fish_scripts_cover_the_whole_tree`).
"""

from __future__ import annotations

import argparse
import os
import pty
import re
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from envguard.cli import build_parser
from envguard.cli.completion_tree import VALUES, bundled_locks, command_tree
from envguard.cli.program import COMMANDS
from envguard.exitcodes import ExitCode

BASH_BREAKS = "@><=;|&(:"
"""bash's COMP_WORDBREAKS, less blanks and quotes: it splits a word at these."""
HOSTILE = ("$(touch pwned).toml", "a b.toml", "x;touch pwned2.toml", "-rf.toml",
           "ok\n$(touch pwned3).toml", "`touch pwned4`.toml")
LOCKS = ["dflash-train", "train"]
needs_zsh = pytest.mark.skipif(shutil.which("zsh") is None, reason="zsh is not installed")
needs_fish = pytest.mark.skipif(shutil.which("fish") is None, reason="fish is not installed")


def envguard(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "envguard", *args], capture_output=True,
                          text=True, timeout=60, check=False, cwd=cwd)


@pytest.fixture(scope="module")
def scripts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("completion")
    paths = {}
    for shell in ("bash", "zsh", "fish"):
        proc = envguard("completion", shell)
        assert proc.returncode == ExitCode.OK and proc.stderr == "", proc.stderr
        paths[shell] = folder / f"envguard.{shell}"
        paths[shell].write_text(proc.stdout)
    return paths


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A folder with lockfiles/train.toml, files named to run code, and a snapshot."""
    root = tmp_path / "project"
    (root / "lockfiles" / "dir.toml").mkdir(parents=True)
    (root / "lockfiles" / "train.toml").write_text("")
    for name in HOSTILE:
        (root / "lockfiles" / name).write_text("")
    (root / "good.json").write_text("{}")
    return root


def no_code_ran(root: Path) -> bool:
    return not [p for p in root.rglob("pwned*")] and not list(Path.cwd().glob("pwned*"))


# ------------------------------------------------------------------------- the tree

def test_the_table_names_real_arguments() -> None:
    """Every (command, dest) of VALUES is an argument of that command: renaming one
    without the table would silently stop its completion."""
    dests = {}
    parser = build_parser()
    stack = [("", parser)]
    while stack:
        path, p = stack.pop()
        dests[path] = {a.dest for a in p._actions}
        for a in p._actions:
            if isinstance(a, argparse._SubParsersAction):
                stack += [(f"{path} {name}".strip(), child) for name, child in a.choices.items()]
    assert [key for key in VALUES if key[1] not in dests.get(key[0], ())] == []
    kinds = {(c.path, i): v.kind for c in command_tree(parser) for i, v in
             enumerate(c.positionals)}
    assert kinds[("diff", 0)] == kinds[("bisect", 1)] == "snapshot"
    assert kinds[("restore", 0)] == "recorded" and kinds[("check", 0)] == "lock"
    assert kinds[("cache save", 0)] == "files"  # NAME: an archive's name, no lock


def test_bundled_locks_are_plain_tokens(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                        ) -> None:
    assert bundled_locks() == ("dflash-train",)
    for name in ("ok.toml", "$(touch pwned).toml", "a b.toml", "-x.toml"):
        (tmp_path / name).write_text("")
    monkeypatch.setattr("envguard.gate.lookup.bundled_lock_dirs", lambda: [tmp_path])
    assert bundled_locks() == ("ok",)


def test_the_script_holds_nothing_of_the_folder_it_was_made_in(project: Path,
                                                                scripts: dict[str, Path]
                                                                ) -> None:
    for shell, path in scripts.items():
        proc = envguard("completion", shell, cwd=project)
        assert proc.stdout == path.read_text()
        assert "dflash-train" in proc.stdout and "train.toml" not in proc.stdout
        assert "pwned" not in proc.stdout


def test_completion_needs_a_known_shell() -> None:
    proc = envguard("completion", "tcsh")
    assert proc.returncode == ExitCode.USAGE
    assert "invalid choice" in proc.stderr and len(proc.stderr.splitlines()) == 1
    assert "fish" in envguard("completion", "--help").stdout


# ------------------------------------------------------------------------- bash

def bash_words(line: str) -> list[str]:
    """COMP_WORDS as bash splits ``line`` (no quotes in it): at blanks, and around each
    run of word-break characters (``@last-good:x`` is ``@ last-good : x``)."""
    words = [w for token in line.split() for w in
             re.findall(f"[{re.escape(BASH_BREAKS)}]+|[^{re.escape(BASH_BREAKS)}]+", token)]
    return [*words, ""] if not line or line[-1].isspace() else words


def bash_complete(script: Path, line: str, cwd: Path | None = None) -> list[str]:
    """COMPREPLY for the command line ``line``, the cursor at its end."""
    def q(w: str) -> str:
        return "'" + w.replace("'", "'\\''") + "'"

    words = bash_words(line)
    program = (f"source {q(str(script))}\nCOMP_WORDS=({' '.join(map(q, words))})\n"
               f"COMP_CWORD={len(words) - 1}\nCOMP_LINE={q(line)}\nCOMP_POINT={len(line)}\n"
               "COMP_WORDBREAKS=$' \\t\\n\"\\'" + BASH_BREAKS + "'\n"
               "COMPREPLY=()\n_envguard\nprintf '%s\\n' \"${COMPREPLY[@]}\"\n")
    proc = subprocess.run(["bash", "--norc", "--noprofile", "-c", program], capture_output=True,
                          text=True, cwd=cwd, timeout=30, check=False)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    return [ln for ln in proc.stdout.splitlines() if ln]


def typed(shell: str, script: Path, keys: str, cwd: Path) -> str:
    """The line an interactive ``shell`` shows after ``keys`` were typed (TAB is \\t,
    readline's insert-completions ESC *): the completion the user really gets."""
    home = cwd.parent / "home"
    home.mkdir(exist_ok=True)
    show = "\\x3c<%s>>"  # not "<<" itself: the echo of this line must not match
    if shell == "bash":
        argv = ["bash", "--norc", "--noprofile", "-i"]
        setup = (f"PS1='$ '; unset HISTFILE; source '{script}'; "
                 f"bind -x '\"\\C-t\": printf \"{show}\\n\" \"$READLINE_LINE\"'; echo RE\"\"ADY\n")
    else:
        argv = ["zsh", "-f", "-i"]
        setup = (f"PS1='$ '; autoload -Uz compinit; compinit -u -D; source '{script}'; "
                 f"_eg_show() {{ printf '{show}\\n' \"$BUFFER\" }}; zle -N _eg_show; "
                 "bindkey '^T' _eg_show; print RE''ADY\n")
    env = {"PATH": os.environ["PATH"], "TERM": "dumb", "HOME": str(home)}
    pid, fd = pty.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.chdir(cwd)
            os.execvpe(argv[0], argv, env)  # noqa: S606 - the shell itself, on the terminal
        finally:
            os._exit(127)
    try:
        os.write(fd, setup.encode())
        _read_until(fd, rb"READY\r?\n")
        os.write(fd, keys.encode() + b"\x14")
        return _read_until(fd, rb"<<(.*?)>>\r?\n").group(1).decode()
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(fd)


def _read_until(fd: int, pattern: bytes) -> re.Match[bytes]:
    seen = b""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if select.select([fd], [], [], 0.1)[0]:
            try:
                seen += os.read(fd, 4096)
            except OSError:
                break
            if found := re.search(pattern, seen):
                return found
    raise AssertionError(f"the shell never printed {pattern!r}; it printed {seen!r}")


def test_bash_script_is_valid_bash(scripts: dict[str, Path]) -> None:
    check = subprocess.run(["bash", "-n", str(scripts["bash"])], capture_output=True,
                           text=True, check=False)
    assert check.returncode == 0, check.stderr


def test_bash_completes_commands_options_and_choices(scripts: dict[str, Path],
                                                     tmp_path: Path) -> None:
    bash = scripts["bash"]
    assert bash_complete(bash, "envguard ") == list(COMMANDS)
    assert bash_complete(bash, "envguard sn") == ["snapshot"]
    assert bash_complete(bash, "envguard -") == ["-h", "--help", "-V", "--version"]
    assert bash_complete(bash, "envguard snapshot --ve") == ["--verify"]
    assert bash_complete(bash, "envguard snapshot --verify ") == ["size", "hash", "none"]
    assert bash_complete(bash, "envguard snapshot --verify=h") == ["hash"]
    assert bash_complete(bash, "envguard cache s") == ["status", "save"]
    assert bash_complete(bash, "envguard fleet snapshot --format m") == ["markdown"]
    # Options of the command the cursor is in, after option values and positionals.
    assert "--offline" in bash_complete(bash, "envguard restore GOOD.json --python .venv --")
    assert bash_complete(bash, "envguard check --python x --fo") == ["--format"]
    assert bash_complete(bash, "envguard completion ") == ["bash", "zsh", "fish"]
    # The help command's topics are choices like any other.
    assert bash_complete(bash, "envguard help dfl") == ["dflash"]
    assert "compile-race" in bash_complete(bash, "envguard help ")
    assert bash_complete(bash, "envguard help cli ") == []  # one topic: nothing after it
    # A value that is a path completes files.
    (tmp_path / "good.json").write_text("{}")
    assert bash_complete(bash, "envguard diff go", cwd=tmp_path) == ["good.json"]
    assert bash_complete(bash, "envguard snapshot -o g", cwd=tmp_path) == ["good.json"]


def test_bash_completes_the_command_line_of_run(scripts: dict[str, Path],
                                                tmp_path: Path) -> None:
    tool = tmp_path / "bin" / "qatool-for-completion"
    tool.parent.mkdir()
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    (tmp_path / "data.txt").write_text("")
    script = tmp_path / "with-path.bash"
    script.write_text(f"PATH={tool.parent}:$PATH\n" + scripts["bash"].read_text())
    assert bash_complete(script, "envguard run -- qatool-for") == [tool.name]
    assert bash_complete(script, "envguard run --lock x.toml qatool-for") == [tool.name]
    # bisect's command comes after GOOD and BAD; before, they are snapshots.
    assert bash_complete(script, "envguard bisect a.json b.json qatool-for") == [tool.name]
    assert bash_complete(script, "envguard bisect a.json qatool-for") == []
    # The command's own words are its business: files, never envguard's options.
    assert bash_complete(script, "envguard run -- qatool da", cwd=tmp_path) == ["data.txt"]
    assert bash_complete(script, "envguard run -- qatool --f", cwd=tmp_path) == []


def test_bash_snapshot_arguments_complete_the_aliases(scripts: dict[str, Path],
                                                      project: Path) -> None:
    bash = scripts["bash"]
    every = ["@last-good", "@latest", "@run:1", "@run:2", "@run:3", "@now",
             "@last-good:dflash-train", "@last-good:train"]
    for line in ("envguard diff @", "envguard diff good.json @", "envguard bisect @",
                 "envguard bisect a.json @", "envguard bisect --runs 2 a.json @"):
        assert bash_complete(bash, line, cwd=project) == every, line
    recorded = [a for a in every if a != "@now"]  # restore, fleet, cache read a record
    for line in ("envguard restore @", "envguard fleet diff @", "envguard fleet diff a b @",
                 "envguard fleet diff --baseline @", "envguard cache save --from-snapshot @"):
        assert bash_complete(bash, line, cwd=project) == recorded, line
    assert bash_complete(bash, "envguard diff @la", cwd=project) == [
        "@last-good", "@latest", "@last-good:dflash-train", "@last-good:train"]
    # After the colon bash replaces only what follows it: the replies say no more.
    assert bash_complete(bash, "envguard diff @last-good:", cwd=project) == LOCKS
    assert bash_complete(bash, "envguard diff @run:", cwd=project) == ["1", "2", "3"]
    # Files too, unless the word begins with @.
    assert bash_complete(bash, "envguard diff go", cwd=project) == ["good.json"]
    assert "good.json" in bash_complete(bash, "envguard restore ", cwd=project)
    # Not snapshot arguments: no aliases.
    for line in ("envguard snapshot -o @", "envguard lock --from @", "envguard diff --python @",
                 "envguard diff a b @", "envguard cache save @"):
        assert bash_complete(bash, line, cwd=project) == [], line
    assert no_code_ran(project)


def test_bash_completes_lock_names(scripts: dict[str, Path], project: Path) -> None:
    bash = scripts["bash"]
    assert bash_complete(bash, "envguard check ", cwd=project) == LOCKS
    assert bash_complete(bash, "envguard check tr", cwd=project) == ["train"]
    assert bash_complete(bash, "envguard lock ", cwd=project) == LOCKS
    assert bash_complete(bash, "envguard run --lock tr", cwd=project) == ["train"]
    assert bash_complete(bash, "envguard check --lock=tr", cwd=project) == ["train"]
    # --lock also takes a path.
    assert bash_complete(bash, "envguard check --lock go", cwd=project) == ["good.json"]
    # Where no lock is named, none is offered; a folder without lockfiles/ has the bundled.
    assert bash_complete(bash, "envguard lock --lock tr", cwd=project) == []
    assert bash_complete(bash, "envguard check x ", cwd=project) == []
    assert bash_complete(bash, "envguard check ", cwd=project / "lockfiles") == [
        "dflash-train"]
    assert no_code_ran(project)


def test_hostile_lock_names_are_never_offered_nor_run(scripts: dict[str, Path],
                                                      project: Path) -> None:
    for line in ("envguard check ", "envguard check -", "envguard diff @last-good:",
                 "envguard check --lock ", "envguard check a", "envguard check ok"):
        replies = bash_complete(scripts["bash"], line, cwd=project)
        assert not [r for r in replies if r.endswith(".toml") or "touch" in r], line
    assert bash_complete(scripts["bash"], "envguard check ", cwd=project) == LOCKS
    assert no_code_ran(project)


def test_bash_really_completes_at_the_prompt(scripts: dict[str, Path], project: Path) -> None:
    bash = scripts["bash"]
    assert typed("bash", bash, "envguard diff @lat\t", project) == "envguard diff @latest "
    assert typed("bash", bash, "envguard diff @la\x1b*", project) == (
        "envguard diff @last-good @last-good:dflash-train @last-good:train @latest ")
    assert typed("bash", bash, "envguard diff @last-good:tr\t", project) == (
        "envguard diff @last-good:train ")
    assert typed("bash", bash, "envguard check \x1b*", project) == (
        "envguard check dflash-train train ")
    assert typed("bash", bash, "envguard check a\t", project) == "envguard check a"
    assert typed("bash", bash, "envguard help dfl\t", project) == "envguard help dflash "
    assert no_code_ran(project)


# ------------------------------------------------------------------------- zsh

ZSH_STANDINS = r"""
compdef() { print -r -- "compdef $*"; }
_describe() { local -a items; items=("${(@P)4}"); print -r -- "$2: ${(j: :)${items[@]%%:*}}"; }
compadd() { [[ $1 == -- ]] && shift; print -r -- "values: $*"; }
_files() { print -r -- "files"; }
_command_names() { print -r -- "command names"; }
"""


@needs_zsh
def test_zsh_script(scripts: dict[str, Path], project: Path) -> None:
    script = scripts["zsh"]
    check = subprocess.run(["zsh", "-n", str(script)], capture_output=True, text=True,
                           check=False)
    assert check.returncode == 0, check.stderr

    def complete(*words: str) -> list[str]:
        quoted = " ".join("'" + w.replace("'", "'\\''") + "'" for w in words)
        program = (f"{ZSH_STANDINS}\nsource '{script}'\nwords=({quoted})\n"
                   f"CURRENT={len(words)}\n_envguard\n")
        run = subprocess.run(["zsh", "-f", "-c", program], capture_output=True, text=True,
                             timeout=30, check=False, cwd=project,
                             env={**os.environ, "PATH": "/usr/bin:/bin"})
        assert run.returncode == 0 and run.stderr == "", run.stderr
        lines = run.stdout.splitlines()
        assert lines[0] == "compdef _envguard envguard"  # sourced: registered, not run
        return lines[1:]

    assert complete("envguard", "") == ["commands: " + " ".join(COMMANDS)]
    (options,) = complete("envguard", "snapshot", "--")
    assert options.startswith("options: ") and "--verify" in options.split()
    assert complete("envguard", "snapshot", "--verify", "") == ["values: size hash none"]
    assert complete("envguard", "cache", "") == ["commands: status save restore mark"]
    assert complete("envguard", "diff", "") == [
        "values: @last-good @latest @run:1 @run:2 @run:3 @now @last-good:dflash-train "
        "@last-good:train", "files"]
    assert complete("envguard", "restore", "") == [
        "values: @last-good @latest @run:1 @run:2 @run:3 @last-good:dflash-train "
        "@last-good:train", "files"]
    assert complete("envguard", "check", "") == ["values: dflash-train train"]
    assert complete("envguard", "run", "--lock", "") == ["values: dflash-train train", "files"]
    assert complete("envguard", "lock", "--lock", "") == ["files"]
    assert complete("envguard", "diff", "a", "b", "") == []  # past its positionals
    assert complete("envguard", "run", "--", "") == ["command names"]
    assert complete("envguard", "bisect", "a", "b", "") == ["command names"]
    assert complete("envguard", "completion", "") == ["values: bash zsh fish"]
    assert complete("envguard", "help", "")[0].startswith("values: api bisect cache")
    assert no_code_ran(project)
    # The descriptions are the options' help.
    assert "'--offline:uv" in script.read_text()


@needs_zsh
def test_zsh_really_completes_at_the_prompt(scripts: dict[str, Path], project: Path) -> None:
    zsh = scripts["zsh"]
    assert typed("zsh", zsh, "envguard diff @lat\t", project) == "envguard diff @latest "
    assert typed("zsh", zsh, "envguard diff @last-good:tr\t", project) == (
        "envguard diff @last-good:train ")
    assert typed("zsh", zsh, "envguard check tr\t", project) == "envguard check train "
    assert typed("zsh", zsh, "envguard check a\t", project) == "envguard check a"
    assert typed("zsh", zsh, "envguard cache sa\t", project) == "envguard cache save "
    assert no_code_ran(project)


# ------------------------------------------------------------------------- fish

def fish_complete(script: Path, line: str, cwd: Path) -> list[str]:
    """What fish offers for ``line`` (its own engine, ``complete -C``), descriptions cut."""
    program = f"source '{script}'; complete -C {fish_quote(line)}"
    proc = subprocess.run(["fish", "--no-config", "-c", program], capture_output=True,
                          text=True, cwd=cwd, timeout=30, check=False,
                          env={**os.environ, "HOME": str(cwd.parent)})
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    return [ln.split("\t")[0] for ln in proc.stdout.splitlines()]


def fish_quote(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


@needs_fish
def test_fish_completes(scripts: dict[str, Path], project: Path) -> None:
    fish = scripts["fish"]
    check = subprocess.run(["fish", "--no-execute", str(fish)], capture_output=True,
                           text=True, check=False)
    assert check.returncode == 0, check.stderr
    assert fish_complete(fish, "envguard ", project) == sorted(COMMANDS)
    assert fish_complete(fish, "envguard cache s", project) == ["save", "status"]
    assert fish_complete(fish, "envguard snapshot --verify ", project) == [
        "hash", "none", "size"]
    assert fish_complete(fish, "envguard diff --fo", project) == ["--format"]
    assert fish_complete(fish, "envguard completion ", project) == ["bash", "fish", "zsh"]
    assert fish_complete(fish, "envguard help dfl", project) == ["dflash"]
    assert fish_complete(fish, "envguard diff @la", project) == [
        "@last-good", "@last-good:dflash-train", "@last-good:train", "@latest"]
    assert "@now" not in fish_complete(fish, "envguard restore @", project)
    assert "@now" in fish_complete(fish, "envguard bisect a.json @", project)
    assert fish_complete(fish, "envguard check ", project) == LOCKS
    assert fish_complete(fish, "envguard run --lock tr", project) == ["train"]
    assert fish_complete(fish, "envguard lock --from @", project) == []
    assert "echo" in fish_complete(fish, "envguard run -- ech", project)
    assert "echo" not in fish_complete(fish, "envguard run --lock ech", project)
    assert fish_complete(fish, "envguard run -- ls lockf", project) == ["lockfiles/"]
    assert fish_complete(fish, "envguard bisect a b ls lockf", project) == ["lockfiles/"]
    assert no_code_ran(project)


# ------------------------------------------------------------------------- as text

def test_zsh_and_fish_scripts_cover_the_whole_tree(scripts: dict[str, Path]) -> None:
    """Checked as text, shell or no shell: every command and option of the parser is in
    both scripts, under its own command; hidden options are not."""
    zsh, fish = scripts["zsh"].read_text(), scripts["fish"].read_text()
    tree = command_tree(build_parser())
    for command in tree:
        zsh_case = next(ln for ln in zsh.splitlines()
                        if ln.startswith(f'        "{command.path}") commands=('))
        fish_lines = [ln for ln in fish.splitlines()
                      if f"__envguard_is '{command.path}' " in ln]
        for name, _ in command.commands:
            assert f"'{name}:" in zsh_case
            assert any(f"-f -a '{name}'" in ln for ln in fish_lines), name
        for option in command.options:
            for name in option.names:
                assert f"'{name}:" in zsh_case, (command.path, name)
                flag = f"-l {name[2:]}" if name.startswith("--") else f"-s {name[1:]}"
                assert any(re.search(f"{flag}( |$)", ln) for ln in fish_lines), name
    assert "--no-cache-marker" not in zsh and "no-cache-marker" not in fish
    # Lock names are globbed by the shell, checked as plain tokens before being offered.
    assert "lockfiles/*.toml(N.)" in zsh and "*[!A-Za-z0-9._+-]*" in zsh
    assert "'^lockfiles/[A-Za-z0-9][A-Za-z0-9._+-]*\\.toml$'" in fish
