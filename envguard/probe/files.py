"""Your own files (training scripts, configs) by md5 and sha256, and the git state.

Patterns come from ``--file`` (relative to the current directory) and from
``[tool.envguard] files`` in the nearest ``pyproject.toml`` (relative to it).
md5 is recorded because that is what people compare by hand with ``md5sum``.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
import sys
from collections.abc import Mapping
from pathlib import Path

from envguard.errors import InputError
from envguard.model import Files, GitState, ProbeIssue, TrackedFile
from envguard.probe.commands import CommandResult

_CHUNK = 1 << 20
MAX_DIRTY = 500


def find_pyproject(start: Path) -> Path | None:
    for folder in (start, *start.parents):
        candidate = folder / "pyproject.toml"
        if candidate.is_file():
            return candidate
    return None


def project_config(pyproject: Path) -> tuple[list[str], list[str]]:
    """``[tool.envguard]`` ``files`` (absolute globs) and ``env`` (extra variable patterns).

    Raises InputError for unreadable or malformed TOML, or fields of the wrong type.
    """
    from envguard.input_file import read_input

    if sys.version_info >= (3, 11):  # imported here: most snapshots find no pyproject.toml
        import tomllib
    else:  # pragma: no cover - exercised only on Python 3.10
        import tomli as tomllib
    try:
        data = tomllib.loads(read_input(pyproject, what="pyproject.toml").decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise InputError(f"{pyproject} is not valid TOML: {exc}") from None
    tool = data.get("tool", {})
    section = tool.get("envguard", {}) if isinstance(tool, dict) else {}
    if not isinstance(section, dict):
        raise InputError(f"{pyproject}: [tool.envguard] must be a table")
    lists = []
    for key in ("files", "env"):
        value = section.get(key, [])
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise InputError(f"{pyproject}: [tool.envguard] {key} must be a list of strings")
        lists.append(value)
    return [str(pyproject.parent / f) for f in lists[0]], list(lists[1])


def digest_file(path: str) -> tuple[int, str, str]:
    """(size, md5 hex, sha256 hex), read once.

    Raises OSError for anything but a regular file: reading a FIFO or a character
    device that a glob happened to match would block or never end.
    """
    md5, sha = hashlib.md5(usedforsecurity=False), hashlib.sha256()
    size = 0
    # O_NONBLOCK: opening a FIFO with no writer must not block; regular files ignore it.
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", path)
        while chunk := fh.read(_CHUNK):
            md5.update(chunk)
            sha.update(chunk)
            size += len(chunk)
    return size, md5.hexdigest(), sha.hexdigest()


def track(patterns: list[str], issues: list[ProbeIssue]) -> list[TrackedFile]:
    if not patterns:
        return []
    import glob  # here: most snapshots track no files

    out: dict[str, TrackedFile] = {}
    for pattern in patterns:
        matches = sorted(glob.glob(pattern, recursive=True)) if glob.has_magic(pattern) else [
            pattern
        ]
        folders = [m for m in matches if os.path.isdir(m)]
        if folders and not glob.has_magic(pattern):
            issues.append(ProbeIssue(section="files", message="is a folder; name files or use "
                                     "a glob such as DIR/**/*.py", path=os.path.abspath(pattern)))
        matches = [m for m in matches if m not in folders]
        if not matches:
            out.setdefault(pattern, TrackedFile(pattern=pattern, path=pattern, exists=False))
            continue
        for match in matches:
            path = os.path.abspath(match)
            if path in out:
                continue
            try:
                size, md5, sha = digest_file(path)
            except FileNotFoundError:
                out[path] = TrackedFile(pattern=pattern, path=path, exists=False)
                continue
            except OSError as exc:
                issues.append(ProbeIssue(section="files", message=f"cannot read: "
                                         f"{exc.strerror or exc}", path=path))
                out[path] = TrackedFile(pattern=pattern, path=path, exists=True)
                continue
            out[path] = TrackedFile(pattern=pattern, path=path, exists=True, size=size, md5=md5,
                                    sha256=sha)
    return [out[k] for k in sorted(out)]


GIT_LOCATION_ENV = ("GIT_DIR", "GIT_WORK_TREE")
"""Variables that tell git where the repository is, wherever the working directory lies."""


def may_be_in_git_repo(cwd: str, env: Mapping[str, str]) -> bool:
    """Whether git could find a work tree from ``cwd``: one of :data:`GIT_LOCATION_ENV` is
    set, or ``cwd`` or a folder above it holds ``.git`` (a folder, or a file as in a linked
    worktree or a submodule). Without either ``git rev-parse`` fails, so a snapshot outside
    any repository starts no git at all (two processes, 5-10 ms of CPU)."""
    if any(env.get(name) for name in GIT_LOCATION_ENV):
        return True
    folder = os.path.abspath(cwd)
    while True:
        if os.path.lexists(os.path.join(folder, ".git")):
            return True
        parent = os.path.dirname(folder)
        if parent == folder:
            return False
        folder = parent


def parse_git_status(result: CommandResult, root: str) -> GitState:
    """Parse ``git status --porcelain=v2 --branch -z``."""
    commit = branch = None
    dirty: list[str] = []
    untracked = 0
    records = iter(result.stdout.split("\0"))
    for record in records:
        if record.startswith("# branch.oid "):
            oid = record.split(" ", 2)[2]
            commit = None if oid == "(initial)" else oid
        elif record.startswith("# branch.head "):
            head = record.split(" ", 2)[2]
            branch = None if head == "(detached)" else head
        elif record.startswith(("1 ", "2 ", "u ")):
            fields = record.split(" ", {"1": 8, "2": 9, "u": 10}[record[0]])
            if len(dirty) < MAX_DIRTY:
                dirty.append(fields[-1])
            if record[0] == "2":
                next(records, None)  # the rename's original path: not a record of its own
        elif record.startswith("? "):
            untracked += 1
    return GitState(root=root, commit=commit, branch=branch, dirty=sorted(dirty),
                    untracked=untracked)


def collect(
    patterns: list[str], git_root: CommandResult | None, git_status: CommandResult | None,
    issues: list[ProbeIssue],
) -> Files:
    files = track(patterns, issues)
    git = None
    if git_root is not None and git_root.ok and git_status is not None:
        root = git_root.stdout.strip()
        if git_status.ok:
            git = parse_git_status(git_status, root)
        else:
            issues.append(ProbeIssue(section="files", message=f"git status failed: "
                                     f"{git_status.error}", path=root))
    return Files(files=files, git=git)
