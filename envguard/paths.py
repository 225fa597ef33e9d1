"""envguard's own folders, in one place.

Per user (``user_dir``): ``$ENVGUARD_CACHE_DIR``, else ``$XDG_CACHE_HOME/envguard``, else
``~/.cache/envguard``. It holds envguard's memo files (digests, parsed RECORDs, GPU facts,
dependency closures: each only saves time and may be deleted) and the default store of
compile-cache archives (``compile-caches/``). The compile caches themselves are torch's
and triton's, wherever those put them.

Per project, under the working directory: ``.envguard/snapshots`` (``envguard snapshot``;
``by-digest/`` the snapshots of guarded runs, stored once by content), ``.envguard/runs``
(``envguard run``: one record per run and the ``last-good.json`` pointer) and
``.envguard/fleet`` (``envguard fleet snapshot``). They are written as state
(:mod:`envguard.atomic`'s ``state_root``): never through a symlink.

The bytecode and memo folders are used only when :func:`private_folder` trusts them.
:func:`rebased` is the one rule for a path of one folder said of another (an environment
and its scratch copy).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

STATE_FOLDER = ".envguard"
"""The project state folder: made with a ``.gitignore`` of ``*`` in it, as ``uv venv`` makes
a venv, so that run records and snapshots never reach a commit by accident."""
GITIGNORE = "# created by envguard automatically\n*\n"


def make_folder(name: str, parent: int) -> None:
    """Make folder ``name`` in the open folder ``parent`` (one that exists is left as it is).
    The state folder, when made here, gets its ``.gitignore``: never through a link, never
    over a file (a folder made a moment ago holds none unless someone raced us)."""
    try:
        os.mkdir(name, 0o777, dir_fd=parent)
    except FileExistsError:
        return
    if name != STATE_FOLDER:
        return
    nofollow = getattr(os, "O_NOFOLLOW", 0)
    try:
        folder = os.open(name, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | nofollow,
                         dir_fd=parent)
    except OSError:
        return
    try:
        fd = os.open(".gitignore", os.O_WRONLY | os.O_CREAT | os.O_EXCL | nofollow, 0o644,
                     dir_fd=folder)
        try:
            os.write(fd, GITIGNORE.encode())
        finally:
            os.close(fd)
    except OSError:
        pass
    finally:
        os.close(folder)


PROJECT_DIR = Path(STATE_FOLDER)
SNAPSHOT_DIR = PROJECT_DIR / "snapshots"
SNAPSHOT_BY_DIGEST_DIR = SNAPSHOT_DIR / "by-digest"
"""The snapshots guarded runs verified, stored once each: ``sha256-<hex>.json``."""
RUNS_DIR = PROJECT_DIR / "runs"
FLEET_DIR = PROJECT_DIR / "fleet"


def user_dir() -> Path:
    """``$ENVGUARD_CACHE_DIR``, else ``$XDG_CACHE_HOME/envguard``, else ``~/.cache/envguard``."""
    explicit = os.environ.get("ENVGUARD_CACHE_DIR")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".cache"
    return base / "envguard"


def memo_dir() -> Path:
    """Where envguard's memo files go: the top of :func:`user_dir`."""
    return user_dir()


def archive_store() -> Path:
    """The default store of compile-cache archives (``envguard cache save``)."""
    return user_dir() / "compile-caches"


_TRUST: dict[str, str | None] = {}
DISTRUSTED: list[str] = []
"""Why a folder was not used, one line each, for the command line to show under
``ENVGUARD_DEBUG`` (engines print nothing)."""


def private_folder(folder: Path, *, parents: int = 1) -> bool:
    """Whether ``folder`` may be trusted with envguard's bytecode or memo files, as ssh
    trusts ``~/.ssh``: the folder (made 0700 when missing, with any missing parents; a link
    judged by where it leads) is owned by this user and not writable by group or others; its
    ``parents`` closest parents are owned by this user or root and not writable by group or
    others unless sticky (``/tmp``). Decided once per process; a refusal is kept in
    DISTRUSTED. Costs a few ``lstat`` calls."""
    return why_not_private(folder, parents=parents) is None


def why_not_private(folder: Path, *, parents: int = 1) -> str | None:
    """Why :func:`private_folder` does not trust ``folder``, in a few words; None when it
    does."""
    key = os.path.abspath(folder)
    if key not in _TRUST:
        _TRUST[key] = _distrust(Path(key), parents)
        if _TRUST[key] is not None:
            DISTRUSTED.append(f"not using {key}: {_TRUST[key]}")
    return _TRUST[key]


def _distrust(folder: Path, parents: int) -> str | None:
    missing = [p for p in (folder, *folder.parents) if not os.path.lexists(p)]
    for path in reversed(missing):
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass  # made by another process meanwhile: judged below like any other
        except OSError as exc:
            return f"cannot make {path}: {exc.strerror or exc}"
    uid = os.geteuid() if hasattr(os, "geteuid") else None
    real = Path(os.path.realpath(folder))  # a link is judged by the folders it leads to
    for depth, path in enumerate((real, *list(real.parents)[:parents])):
        try:
            st = os.lstat(path)
        except OSError as exc:
            return f"{path}: {exc.strerror or exc}"
        if not stat.S_ISDIR(st.st_mode):
            return f"{path} is not a folder"
        if uid is None:
            continue
        owners = (uid,) if depth == 0 else (uid, 0)
        if st.st_uid not in owners:
            return f"{path} is owned by uid {st.st_uid}, not by this user"
        if st.st_mode & 0o022 and (depth == 0 or not st.st_mode & stat.S_ISVTX):
            return f"{path} is writable by group or others (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def rebased(path: str, old: str, new: str) -> str:
    """``path`` inside (or at) the folder ``old`` as the same place in ``new``; any other
    path unchanged. Plain string work: nothing is resolved."""
    if path == old or path.startswith(old + os.sep):
        return new + path[len(old):]
    return path
