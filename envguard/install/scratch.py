"""A scratch copy of an environment, cheap enough to make before every change.

:func:`scratch_copy` clones a venv's prefix into a sibling folder
``.NAME.envguard-scratch-<pid>`` (the same filesystem, so hard links work): folders are
made anew, symlinks copied as links (one that leads into the environment is pointed at
the copy's own folder), ``bin/`` scripts, ``pyvenv.cfg``, ``.pth`` files and every
``*.dist-info`` folder's files copied, ``__pycache__`` left out, and every other file hard
linked (copied where a link cannot be made). An installer run against the copy's
interpreter changes the copy only: pip and uv replace a file by unlinking or renaming it,
never by writing into it (the tests prove it for both, for installs over another
package's file, upgrades, ``--force-reinstall`` and uninstalls). :class:`LinkGuard` checks
that anyway: every linked file keeps its size and modification time in the real
environment, or the prediction stops with an error that says which file changed.

The copy is removed when the ``with`` block ends, however it ends (Ctrl-C included); a
copy a killed envguard left behind is removed by the next one (its process is gone).
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

from envguard.errors import EnvguardError
from envguard.exitcodes import ExitCode
from envguard.frozen import frozen

_SCRATCH = ".envguard-scratch-"
_COPIED_DIRS = frozenset({"bin", "Scripts"})


class SharedFileChanged(EnvguardError):
    """An installer wrote into a file the scratch copy shares with the environment."""

    exit_code = ExitCode.ENVIRONMENT_ERROR


@frozen
class Cloned:
    """What :func:`clone_tree` did: files linked, copied, and the bytes copied."""

    linked: int
    copied: int
    copied_bytes: int


class LinkGuard:
    """The (size, mtime) of every file linked into the copy, by its real path."""

    def __init__(self) -> None:
        self.keys: dict[str, tuple[int, int]] = {}

    def add(self, path: str, st: os.stat_result) -> None:
        self.keys[path] = (st.st_size, st.st_mtime_ns)

    def changed(self) -> list[str]:
        """Real files whose size or modification time changed since they were linked."""
        out = []
        for path, key in self.keys.items():
            try:
                st = os.stat(path, follow_symlinks=False)
            except OSError:
                out.append(path)
                continue
            if (st.st_size, st.st_mtime_ns) != key:
                out.append(path)
        return out


def scratch_path(prefix: Path) -> Path:
    return prefix.with_name(f".{prefix.name}{_SCRATCH}{os.getpid()}")


def sweep_stale(prefix: Path) -> None:
    """Remove scratch copies of ``prefix`` whose envguard process is gone."""
    head = f".{prefix.name}{_SCRATCH}"
    with contextlib.suppress(OSError):
        for entry in os.scandir(prefix.parent):
            if not entry.name.startswith(head) or not entry.is_dir(follow_symlinks=False):
                continue
            pid = entry.name[len(head):]
            if pid.isdigit() and not _alive(int(pid)):
                shutil.rmtree(entry.path, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def _is_metadata(rel_parts: tuple[str, ...], name: str) -> bool:
    return (any(p.endswith((".dist-info", ".egg-info")) for p in rel_parts)
            or name.endswith(".pth") or name == "pyvenv.cfg"
            or (bool(rel_parts) and rel_parts[0] in _COPIED_DIRS))


def clone_tree(src: Path, dst: Path, guard: LinkGuard) -> Cloned:
    """Copy ``src`` into the new folder ``dst`` as the module says."""
    linked = copied = copied_bytes = 0
    real_src = os.path.realpath(src)
    os.mkdir(dst, 0o755)
    for folder, dirs, files in os.walk(src):
        rel = os.path.relpath(folder, src)
        parts = () if rel == "." else tuple(Path(rel).parts)
        out = dst.joinpath(*parts)
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for name in [*dirs, *files]:
            path = os.path.join(folder, name)
            target = os.path.join(out, name)
            st = os.lstat(path)
            if os.path.islink(path):
                os.symlink(_link_target(path, real_src, str(dst)), target)
                if name in dirs:
                    dirs.remove(name)  # not walked: a link, copied as one
                continue
            if name in dirs:
                os.mkdir(target, st.st_mode & 0o7777 | 0o700)
                continue
            if not _is_metadata(parts, name):
                try:
                    os.link(path, target, follow_symlinks=False)
                except OSError:
                    pass
                else:
                    guard.add(path, st)
                    linked += 1
                    continue
            shutil.copy2(path, target, follow_symlinks=False)
            copied += 1
            copied_bytes += st.st_size
    return Cloned(linked=linked, copied=copied, copied_bytes=copied_bytes)


def _link_target(path: str, real_src: str, dst: str) -> str:
    """A symlink's target in the copy: one that leads into the environment (absolute)
    leads into the copy instead; relative ones and those outside stay."""
    target = os.readlink(path)
    if os.path.isabs(target):
        real = os.path.normpath(target)
        if real == real_src or real.startswith(real_src + os.sep):
            return dst + real[len(real_src):]
    return target


@contextlib.contextmanager
def scratch_copy(prefix: Path) -> Iterator[tuple[Path, LinkGuard, Cloned]]:
    """A scratch copy of the venv at ``prefix``: (its folder, the guard, what it cost)."""
    sweep_stale(prefix)
    folder = scratch_path(prefix)
    if os.path.islink(folder):  # planted: removed, never followed
        os.unlink(folder)
    elif os.path.lexists(folder):
        shutil.rmtree(folder, ignore_errors=True)
    guard = LinkGuard()
    try:
        cloned = clone_tree(prefix, folder, guard)
        yield folder, guard, cloned
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def check_guard(guard: LinkGuard) -> None:
    """SharedFileChanged naming the first files an installer wrote into through a link."""
    changed = guard.changed()
    if changed:
        shown = ", ".join(changed[:3]) + (f" and {len(changed) - 3} more" if len(changed) > 3
                                          else "")
        raise SharedFileChanged(f"the installer wrote into files the scratch copy shares with "
                                f"the environment: {shown}; envguard stopped before running "
                                "the command itself (report it: the installer writes in place)")
