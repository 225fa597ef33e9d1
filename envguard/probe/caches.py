"""Compile caches, located exactly as torch, triton and the CUDA driver locate them.

* inductor: ``$TORCHINDUCTOR_CACHE_DIR``, else ``<tempdir>/torchinductor_<user>``
  (torch/_inductor/runtime/cache_dir_utils.py); its ``triton/<device>`` subfolder
  holds the kernels torch.compile built when ``TRITON_CACHE_DIR`` is unset;
* triton: ``$TRITON_CACHE_DIR``, else ``$TRITON_HOME/.triton/cache`` (home by default);
* cuda: ``$CUDA_CACHE_PATH``, else ``~/.nv/ComputeCache`` (the driver's PTX JIT cache).

Walks never follow symlinks, so a symlink loop inside a cache cannot hang a snapshot;
unreadable folders become recorded issues.

A marker file (``.envguard-builds.json``) at the top of the inductor and triton caches
lists the builds that filled them; nothing else in the cache can tell which torch build
did. The probe only reads it: the marker is written where envguard itself fills or
restores a cache (:mod:`envguard.cache.provenance`: ``envguard cache save``, ``restore``,
``mark``, dflash-train's warm-up). Another build's entries miss silently, so a later diff
can say "populated under another build". A snapshot writes nothing into a cache; with
``remember`` it notes in envguard's own state that it saw the cache under this build
(:mod:`envguard.probe.sightings`).
"""

from __future__ import annotations

import json
import os
import re
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from envguard.errors import InputError
from envguard.model import BuildStamp, CacheDir, ProbeIssue, TorchIdentity

MARKER_NAME = ".envguard-builds.json"
MAX_ENTRIES = 500_000
_MARKED_KINDS = ("inductor", "triton")


def _sanitized_user(user: str | None, uid: object = None) -> str:
    # torch falls back to uid_<uid> when getpass.getuser() fails (no passwd entry), then
    # replaces characters that are illegal in Windows paths. The uid is the target's,
    # as its probe reported it; envguard's own only when the probe did not say.
    if not user:
        if not isinstance(uid, int):
            getuid = getattr(os, "getuid", None)
            uid = getuid() if callable(getuid) else None
        user = f"uid_{uid}" if isinstance(uid, int) else "unknown_user"
    return re.sub(r'[\\/:*?"<>|]', "_", user)


def locations(env: Mapping[str, str], facts: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """(kind, path, source) for every cache location, in a fixed order."""
    home = str(facts.get("home") or os.path.expanduser("~"))
    tempdir = str(facts.get("tempdir") or "/tmp")  # noqa: S108 - torch's own default
    out: list[tuple[str, str, str]] = []
    if env.get("TORCHINDUCTOR_CACHE_DIR") is not None:
        # torch uses the variable whenever it is set (even empty) and makes it absolute.
        out.append(("inductor", os.path.abspath(env["TORCHINDUCTOR_CACHE_DIR"]),
                    "TORCHINDUCTOR_CACHE_DIR"))
    else:
        user = _sanitized_user(facts.get("user"), facts.get("uid"))
        out.append(("inductor", os.path.join(tempdir, f"torchinductor_{user}"), "default"))
    if env.get("TRITON_CACHE_DIR"):
        out.append(("triton", env["TRITON_CACHE_DIR"], "TRITON_CACHE_DIR"))
    elif env.get("TRITON_HOME"):
        out.append(("triton", os.path.join(env["TRITON_HOME"], ".triton", "cache"), "TRITON_HOME"))
    else:
        out.append(("triton", os.path.join(home, ".triton", "cache"), "default"))
    if env.get("CUDA_CACHE_PATH"):
        out.append(("cuda", env["CUDA_CACHE_PATH"], "CUDA_CACHE_PATH"))
    else:
        out.append(("cuda", os.path.join(home, ".nv", "ComputeCache"), "default"))
    return out


_MOUNT_ESCAPE = re.compile(r"\\([0-7]{3})")


def read_mounts(path: str = "/proc/self/mounts") -> list[tuple[str, str]]:
    """(mount point, filesystem type), longest mount point first; empty off Linux.

    A later mount over the same point hides the earlier one, so the last one listed wins.
    """
    try:
        with open(path, encoding="utf-8", errors="surrogateescape") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return []
    by_point: dict[str, str] = {}
    for line in lines:
        parts = line.split()
        if len(parts) >= 3:
            # The kernel escapes space, tab, newline and backslash as octal (\040 ...).
            point = _MOUNT_ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), parts[1])
            by_point.pop(point, None)
            by_point[point] = parts[2]
    mounts = list(by_point.items())
    mounts.sort(key=lambda m: len(m[0]), reverse=True)
    return mounts


def filesystem_of(path: str, mounts: list[tuple[str, str]]) -> str | None:
    real = os.path.realpath(path)
    for point, fstype in mounts:
        if real == point or real.startswith(point.rstrip("/") + "/"):
            return fstype
    return None


def _walk(
    root: str, issues: list[ProbeIssue]
) -> tuple[int, int, dict[str, int], float | None, bool]:
    """Bytes, files, files per top-level folder, newest mtime, truncated. Never follows links."""
    total = files = 0
    entries: dict[str, int] = {}
    newest: float | None = None
    stack: list[tuple[str, str | None]] = [(root, None)]
    while stack:
        folder, top = stack.pop()
        try:
            it = os.scandir(folder)
        except OSError as exc:
            issues.append(ProbeIssue(section="caches", message=f"cannot read folder: "
                                     f"{exc.strerror or exc}", path=folder))
            continue
        with it:
            for entry in it:
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                if stat.S_ISDIR(st.st_mode):
                    stack.append((entry.path, top or entry.name))
                    continue
                if not stat.S_ISREG(st.st_mode):
                    continue  # symlinks (never followed), sockets, fifos: not cache entries
                if entry.name == MARKER_NAME and top is None:
                    continue
                files += 1
                total += st.st_size
                key = top or "."
                entries[key] = entries.get(key, 0) + 1
                if newest is None or st.st_mtime > newest:
                    newest = st.st_mtime
                if files >= MAX_ENTRIES:
                    return total, files, entries, newest, True
    return total, files, entries, newest, False


def read_marker(root: str) -> list[BuildStamp] | None:
    from envguard.input_file import read_input

    try:  # a regular file of at most 1 MiB: a FIFO planted here must not hang the snapshot
        data = json.loads(read_input(os.path.join(root, MARKER_NAME), limit=1 << 20))
    except (InputError, ValueError, RecursionError):
        return None
    builds = data.get("builds") if isinstance(data, dict) else None
    stamps = []
    for item in builds if isinstance(builds, list) else []:
        if isinstance(item, dict) and isinstance(item.get("compat_key"), str):
            stamps.append(
                BuildStamp(
                    compat_key=item["compat_key"],
                    torch_version=_str_or_none(item.get("torch_version")),
                    torch_git_version=_str_or_none(item.get("torch_git_version")),
                    triton_version=_str_or_none(item.get("triton_version")),
                    first_seen=_str_or_none(item.get("first_seen")),
                )
            )
    return stamps


def _check_marker(root: str, issues: list[ProbeIssue]) -> None:
    """A marker that is there but not a regular file (a FIFO, a folder) is never read."""
    try:
        mode = os.lstat(os.path.join(root, MARKER_NAME)).st_mode
    except OSError:
        return
    if not stat.S_ISREG(mode):
        issues.append(ProbeIssue(section="caches", message=f"marker not read: {MARKER_NAME} "
                                 "is not a regular file", path=root))


def _str_or_none(value: object) -> str | None:
    return value if isinstance(value, str) else None


def probe(
    env: Mapping[str, str],
    facts: Mapping[str, Any],
    torch: TorchIdentity,
    *,
    remember: bool = False,
    state_root: Path | None = None,
    mounts: list[tuple[str, str]] | None = None,
) -> tuple[list[CacheDir], list[ProbeIssue]]:
    """Every cache location, walked; the marker read, never written. ``remember``: note
    each non-empty inductor/triton cache as seen under ``torch`` in envguard's own state
    (``state_root``, default :func:`envguard.paths.user_dir`)."""
    mounts = read_mounts() if mounts is None else mounts
    issues: list[ProbeIssue] = []
    result: list[CacheDir] = []
    sightings: list[tuple[str, str, str | None]] = []
    for kind, path, source in locations(env, facts):
        try:
            exists = os.path.isdir(path)
        except OSError:
            exists = False
        if not exists:
            if os.path.islink(path):
                issues.append(ProbeIssue(section="caches", message="cache path is a dangling "
                                         "or looping symlink", path=path))
            result.append(CacheDir(kind=kind, path=path, source=source, exists=False,
                                   filesystem=filesystem_of(os.path.dirname(path) or "/", mounts)))
            continue
        total, files, entries, newest, truncated = _walk(path, issues)
        populated: list[BuildStamp] = []
        marker = "none"
        if kind in _MARKED_KINDS:
            _check_marker(path, issues)
            populated = read_marker(path) or []
            if torch.compat_key is not None and torch.compat_key in {
                    s.compat_key for s in populated}:
                marker = "seen"  # the marker names the current build
            if torch.compat_key is not None and files > 0:
                sightings.append((path, torch.compat_key, torch.version))
        result.append(
            CacheDir(
                kind=kind, path=path, source=source, exists=True, total_bytes=total,
                files=files, entries=dict(sorted(entries.items())), newest_mtime=newest,
                filesystem=filesystem_of(path, mounts), truncated=truncated,
                populated_under=populated, marker=marker,
            )
        )
    if remember:
        from envguard.probe import sightings as sightings_state

        sightings_state.remember(sightings, state_root)
    return result, issues
