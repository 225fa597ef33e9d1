"""Your own files by md5 and sha256, ``[tool.envguard]`` in pyproject.toml, and git state."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import threading
from pathlib import Path

import pytest

from envguard.errors import InputError
from envguard.model import Files, ProbeIssue, TrackedFile
from envguard.probe import SnapshotOptions, collect, files
from envguard.probe.commands import run


def _track(*patterns: str) -> tuple[dict[str, TrackedFile], list[ProbeIssue]]:
    issues: list[ProbeIssue] = []
    return {t.path: t for t in files.track(list(patterns), issues)}, issues


def test_globs_record_real_size_md5_and_sha256(clean_cwd: Path) -> None:
    (clean_cwd / "train.py").write_text("print('train')\n")
    (clean_cwd / "configs").mkdir()
    (clean_cwd / "configs" / "a.yaml").write_text("lr: 1e-4\n")
    (clean_cwd / "configs" / "deep" / "b.yaml").parent.mkdir()
    (clean_cwd / "configs" / "deep" / "b.yaml").write_bytes(b"\x00\xff" * 5)
    big = os.urandom((5 << 20) // 2 + 123)  # crosses the 1 MiB read chunks
    (clean_cwd / "weights.bin").write_bytes(big)
    tracked, issues = _track(str(clean_cwd / "*.py"), str(clean_cwd / "configs/**/*.yaml"),
                             str(clean_cwd / "weights.bin"), str(clean_cwd / "*.bin"),
                             str(clean_cwd / "configs"), str(clean_cwd / "nothing*.txt"))
    # Naming a folder is recorded as a mistake, with a hint; everything else is fine.
    assert [(i.path, i.message.split(";")[0]) for i in issues] == [
        (str(clean_cwd / "configs"), "is a folder")]
    real = [clean_cwd / "train.py", clean_cwd / "configs" / "a.yaml",
            clean_cwd / "configs" / "deep" / "b.yaml", clean_cwd / "weights.bin"]
    for path in real:
        data = path.read_bytes()
        entry = tracked[str(path)]
        assert entry.exists
        assert entry.size == len(data)
        assert entry.md5 == hashlib.md5(data).hexdigest()
        assert entry.sha256 == hashlib.sha256(data).hexdigest()
    assert tracked[str(clean_cwd / "weights.bin")].pattern == str(clean_cwd / "weights.bin")
    missing = tracked[str(clean_cwd / "nothing*.txt")]
    assert (missing.exists, missing.size, missing.sha256) == (False, None, None)
    assert tracked[str(clean_cwd / "configs")].exists is False  # a folder is not a file
    assert len(tracked) == 6


def test_file_option_through_the_snapshot(clean_cwd: Path) -> None:
    (clean_cwd / "run.sh").write_text("torchrun train.py\n")
    snapshot = collect(SnapshotOptions(cwd=clean_cwd, file_patterns=("*.sh", "gone.txt"),
                                       verify="none"))
    by_path = {f.path: f for f in snapshot.files.files}
    assert by_path[str(clean_cwd / "run.sh")].sha256 == hashlib.sha256(
        b"torchrun train.py\n").hexdigest()
    assert by_path[str(clean_cwd / "gone.txt")].exists is False
    assert snapshot.files.git is None  # clean_cwd is outside any repository
    assert snapshot.options.file_patterns == ["*.sh", "gone.txt"]


def test_fifo_matched_by_a_glob_does_not_hang(clean_cwd: Path) -> None:
    os.mkfifo(clean_cwd / "pipe.log")
    (clean_cwd / "real.log").write_text("ok\n")
    result: list[tuple[dict[str, TrackedFile], list[ProbeIssue]]] = []
    worker = threading.Thread(target=lambda: result.append(_track(str(clean_cwd / "*.log"))),
                              daemon=True)
    worker.start()
    worker.join(timeout=10)
    assert not worker.is_alive(), "reading a FIFO blocked the snapshot"
    tracked, issues = result[0]
    assert tracked[str(clean_cwd / "real.log")].md5 == hashlib.md5(b"ok\n").hexdigest()
    assert tracked[str(clean_cwd / "pipe.log")].md5 is None
    assert [(i.section, i.path) for i in issues] == [("files", str(clean_cwd / "pipe.log"))]


# --- [tool.envguard] ----------------------------------------------------------------------

PROJECT = """[project]
name = "trainer"

[tool.envguard]
files = ["configs/*.yaml", "train.py"]
env = ["WANDB_*", "SLURM_JOB_ID"]
"""


def test_project_config_found_by_walking_up(clean_cwd: Path) -> None:
    (clean_cwd / "pyproject.toml").write_text(PROJECT)
    (clean_cwd / "configs").mkdir()
    (clean_cwd / "configs" / "base.yaml").write_text("steps: 10\n")
    (clean_cwd / "train.py").write_text("pass\n")
    deeper = clean_cwd / "src" / "pkg"
    deeper.mkdir(parents=True)
    assert files.find_pyproject(deeper) == clean_cwd / "pyproject.toml"
    patterns, env = files.project_config(clean_cwd / "pyproject.toml")
    assert patterns == [str(clean_cwd / "configs/*.yaml"), str(clean_cwd / "train.py")]
    assert env == ["WANDB_*", "SLURM_JOB_ID"]

    snapshot = collect(SnapshotOptions(cwd=deeper, verify="none",
                                       env={**os.environ, "WANDB_PROJECT": "dflash",
                                            "SLURM_JOB_ID": "42", "SLURM_NODEID": "0"}))
    assert snapshot.errors == []
    assert sorted(f.path for f in snapshot.files.files) == [
        str(clean_cwd / "configs" / "base.yaml"), str(clean_cwd / "train.py")]
    variables = snapshot.environment.variables
    assert variables["WANDB_PROJECT"].value == "dflash"
    assert variables["SLURM_JOB_ID"].value == "42"
    assert "SLURM_NODEID" not in variables
    ignored = collect(SnapshotOptions(cwd=deeper, verify="none", use_project_config=False))
    assert ignored.files.files == []


@pytest.mark.parametrize(("text", "needle"), [
    ("[tool.envguard\nfiles = [", "not valid TOML"),
    ("[tool.envguard]\nfiles = 'train.py'\n", "files must be a list of strings"),
    ("[tool.envguard]\nenv = [1, 2]\n", "env must be a list of strings"),
    ("[tool]\nenvguard = 3\n", "must be a table"),
    (b"\xff\xfe[tool]".decode("latin-1"), "not valid TOML"),
])
def test_malformed_project_config(clean_cwd: Path, text: str, needle: str) -> None:
    pyproject = clean_cwd / "pyproject.toml"
    pyproject.write_bytes(text.encode("latin-1"))
    with pytest.raises(InputError, match=needle) as caught:
        files.project_config(pyproject)
    assert str(pyproject) in str(caught.value)
    # The snapshot still completes and says what was wrong.
    snapshot = collect(SnapshotOptions(cwd=clean_cwd, verify="none"))
    assert [(e.section, e.path) for e in snapshot.errors] == [("files", str(pyproject))]
    assert needle in snapshot.errors[0].message
    assert snapshot.validate() == snapshot


# --- git --------------------------------------------------------------------------------------

@pytest.fixture
def git_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in {"GIT_AUTHOR_NAME": "Test", "GIT_AUTHOR_EMAIL": "t@example.com",
                        "GIT_COMMITTER_NAME": "Test", "GIT_COMMITTER_EMAIL": "t@example.com",
                        "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}.items():
        monkeypatch.setenv(name, value)


def _git(repo: Path, *args: str) -> str:
    proc = subprocess.run(["git", "-c", "commit.gpgsign=false", *args], cwd=repo, text=True,
                          capture_output=True, check=True, timeout=60)
    return proc.stdout.strip()


def _git_state(repo: Path) -> Files:
    issues: list[ProbeIssue] = []
    found = files.collect([], run(["git", "rev-parse", "--show-toplevel"], cwd=str(repo),
                                  timeout=30),
                          run(["git", "status", "--porcelain=v2", "--branch", "-z"],
                              cwd=str(repo), timeout=30), issues)
    assert issues == []
    return found


@pytest.mark.usefixtures("git_env")
def test_git_commit_branch_dirty_and_untracked(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q", "-b", "main")
    initial = _git_state(repo).git
    assert initial is not None and (initial.commit, initial.branch) == (None, "main")
    for name in ("train.py", "with space.py", "? odd name.txt", "1 tricky.txt", "keep.txt"):
        (repo / name).write_text("v1\n")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "first")
    head = _git(repo, "rev-parse", "HEAD")
    _git(repo, "checkout", "-q", "-b", "feature/x")
    (repo / "train.py").write_text("v2\n")  # modified, unstaged
    (repo / "with space.py").write_text("v2\n")
    (repo / "staged.py").write_text("new\n")
    _git(repo, "add", "staged.py")
    # Renames carry the old path as a record of its own; it must not count as one.
    _git(repo, "mv", "? odd name.txt", "renamed.txt")
    _git(repo, "mv", "1 tricky.txt", "renamed2.txt")
    for name in ("u1.txt", "u2.txt"):
        (repo / name).write_text("x\n")

    git = _git_state(repo).git
    assert git is not None
    assert git.root == str(repo)
    assert git.commit == head and len(head) == 40
    assert git.branch == "feature/x"
    assert git.dirty == ["renamed.txt", "renamed2.txt", "staged.py", "train.py",
                         "with space.py"]
    assert git.untracked == 2

    _git(repo, "checkout", "-q", "--detach")
    (repo / "sub").mkdir()
    detached = collect(SnapshotOptions(cwd=repo / "sub", verify="none")).files.git
    assert detached is not None
    assert (detached.commit, detached.branch, detached.root) == (head, None, str(repo))


def _git_spy(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """An environment whose PATH starts with a ``git`` that logs each call, then runs the
    real one: which git commands a snapshot started, with nothing mocked."""
    real = shutil.which("git")
    assert real is not None
    spy = tmp_path / "spy-bin"
    spy.mkdir()
    log = tmp_path / "git-calls.log"
    (spy / "git").write_text(f'#!/bin/sh\necho "$*" >> "{log}"\nexec "{real}" "$@"\n')
    (spy / "git").chmod(0o755)
    return {**os.environ, "PATH": f"{spy}{os.pathsep}{os.environ['PATH']}"}, log


@pytest.mark.usefixtures("git_env")
def test_no_git_runs_outside_any_repository_and_it_runs_inside_one(tmp_path: Path) -> None:
    env, log = _git_spy(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    if files.may_be_in_git_repo(str(outside), os.environ):
        pytest.skip("the temporary folder lies inside a git repository or GIT_DIR is set")
    snap = collect(SnapshotOptions(cwd=outside, verify="none", env=env,
                                   use_project_config=False, remember_caches=False))
    assert snap.files.git is None and not log.exists()

    repo = tmp_path / "repo"
    (repo / "deep" / "er").mkdir(parents=True)
    _git(repo, "init", "-q", "-b", "main")
    assert files.may_be_in_git_repo(str(repo / "deep" / "er"), os.environ)
    inside = collect(SnapshotOptions(cwd=repo / "deep" / "er", verify="none", env=env,
                                     use_project_config=False, remember_caches=False))
    assert inside.files.git is not None and inside.files.git.root == str(repo)
    assert "rev-parse --show-toplevel" in log.read_text()

    # GIT_DIR points git at a repository from anywhere: git runs.
    assert files.may_be_in_git_repo(str(outside), {"GIT_DIR": str(repo / ".git")})
    (tmp_path / "linked").mkdir()
    (tmp_path / "linked" / ".git").write_text("gitdir: /elsewhere\n")  # a worktree's file
    assert files.may_be_in_git_repo(str(tmp_path / "linked"), {})
