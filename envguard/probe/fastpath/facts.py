"""The interpreter probe's answer, kept until anything it depends on changes.

Probing another interpreter means starting it: 15-80 ms of CPU (its ``site`` runs every
``.pth`` file) that a snapshot on a 2-core machine would otherwise take from the RECORD
check. The answer (:func:`envguard.probe._inprocess.collect`) depends only on:

- the interpreter: the path it is started as, and the binary behind it;
- the venv's ``pyvenv.cfg``;
- the environment variables ``site`` and the probe read (every ``PYTHON*``, ``HOME``,
  ``TMPDIR``/``TEMP``/``TMP``, ``LOGNAME``/``USER``/``LNAME``/``USERNAME``), the user and
  the working directory;
- the folders on its ``sys.path``: the names of the ``.pth`` files and
  ``sitecustomize``/``usercustomize`` modules in them, and each one's ``stat``; a folder
  that cannot be listed (absent, a zip file), its own ``stat``.

A listable folder's own time is not in the key: installing or removing a package changes
``site-packages`` but not the answer, and the listing already shows a ``.pth`` file added
or removed. So the answer survives an install (``envguard install`` probes the
environment each time, just after the last one changed it). All of it is the key, checked
at every use (about 1 ms: one listing a folder, one ``stat`` a file); the variables are
kept as a digest, and an answer holding anything that looks like a credential is not kept
at all. uv keeps its interpreter answers by the
executable's path and modification time alone; this key is stricter. What it cannot see
is an edit written into a module that a ``.pth`` file imports; a snapshot with
``use_memo=False`` always probes afresh.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from envguard.paths import rebased
from envguard.probe.fastpath import marshal_file
from envguard.probe.fastpath.marshal_file import Key, stat_key

TAG = ("envguard-interpreter", 2)
ENV_NAMES = frozenset({"HOME", "TMPDIR", "TEMP", "TMP", "LOGNAME", "USER", "LNAME",
                       "USERNAME"})
"""Variables the probe reads besides ``PYTHON*``."""
_SITE_MODULES = ("sitecustomize.py", "usercustomize.py")
RECENT_NS = 2_000_000_000
"""A folder or file changed this close to the probe's start may have changed during it."""


def _stat(path: str, *, follow: bool = True) -> Key | None:
    try:
        return stat_key(os.stat(path) if follow else os.lstat(path))
    except (OSError, ValueError):
        return None


def interpreter_key(exe: str, env: Mapping[str, str]) -> tuple[Any, ...]:
    """Everything but the folders on ``sys.path`` that the answer for ``exe`` depends on."""
    prefix = os.path.dirname(os.path.dirname(os.path.abspath(exe)))
    variables = repr(sorted((k, v) for k, v in env.items()
                            if k.startswith("PYTHON") or k in ENV_NAMES))
    return (exe, _stat(exe, follow=False), os.path.realpath(exe), _stat(exe),
            _stat(os.path.join(prefix, "pyvenv.cfg")),
            hashlib.sha256(variables.encode("utf-8", "surrogateescape")).hexdigest(),
            getattr(os, "getuid", lambda: None)(), getattr(os, "geteuid", lambda: None)(),
            os.getcwd())


def _site_names(folder: str) -> list[str] | None:
    """The ``.pth`` files and site modules of ``folder``, what ``site`` reads there; None
    for a folder that cannot be listed (absent, a zip file)."""
    try:
        names = os.listdir(folder)
    except OSError:
        return None
    return sorted(n for n in names if n.endswith(".pth") or n in _SITE_MODULES)


def folders_state(folders: list[str]) -> tuple[Any, ...]:
    """Each folder's ``.pth`` files and site modules with their stat keys; the stat key of
    a folder that cannot be listed instead."""
    state: list[Any] = []
    for folder in folders:
        names = _site_names(folder)
        if names is None:
            state.append((folder, _stat(folder), None))
        else:
            state.append((folder, None,
                          tuple((n, _stat(os.path.join(folder, n))) for n in names)))
    return tuple(state)


def _touched_since(folders: list[str], state: tuple[Any, ...], since_ns: int) -> bool:
    """Whether a folder or a file of ``state`` was modified at ``since_ns`` or later: the
    folders' own times count here (a ``.pth`` file removed while the probe ran leaves only
    that trace), though not in the key."""
    keys = [_stat(folder) for folder in folders]
    keys += [k for _, _, files in state for _, k in files or ()]
    return any(k is not None and k[1] >= since_ns for k in keys)  # k[1]: the modification time


_SCALARS = frozenset({str, int, float, bool, type(None)})


def _plain(value: Any, depth: int = 0) -> bool:
    """Whether ``value`` is what the probe prints: a dict of str keys holding strings,
    numbers, booleans, None and lists of them, as deep as the probe's own answer (a forged
    memo with a code object or a set inside is a miss, not a crash)."""
    kind = type(value)
    if kind in _SCALARS:
        return True
    if depth > 4:
        return False
    if kind is list:
        return all(_plain(v, depth + 1) for v in value)
    if kind is dict:
        return all(type(k) is str and _plain(v, depth + 1) for k, v in value.items())
    return False


def _folders(facts: dict[str, Any]) -> list[str]:
    seen = [str(p) for p in [*facts.get("sys_path", []), *facts.get("site_packages", [])]]
    return sorted(set(seen))


def _path(exe: str, memo_root: Path) -> Path:
    name = hashlib.sha256(exe.encode("utf-8", "surrogateescape")).hexdigest()[:16]
    return memo_root / f"interpreter-{name}.marshal"


def lookup(exe: str, env: Mapping[str, str], memo_root: Path) -> dict[str, Any] | None:
    """The probe's last answer for ``exe`` if nothing it depends on has changed since."""
    entries, _ = marshal_file.load(_path(exe, memo_root), TAG)
    hit = entries.get(exe)
    if type(hit) is not tuple or len(hit) != 3 or type(hit[2]) is not dict:
        return None
    key, state, facts = hit
    if not (_plain(facts) and type(facts.get("sys_path")) is list
            and type(facts.get("site_packages", [])) is list) \
            or key != interpreter_key(exe, env) \
            or state != folders_state(_folders(facts)):
        return None
    known: dict[str, Any] = facts
    return known


def remember(exe: str, env: Mapping[str, str], memo_root: Path, facts: dict[str, Any],
             key: tuple[Any, ...], started_ns: int) -> str | None:
    """Keep ``facts``, the answer of a probe started at ``started_ns`` when the key was
    ``key``. Nothing is kept if the key changed meanwhile, or if a folder or file of the
    state was touched since the probe started (a change it may not have seen); an error
    message instead of raising."""
    from envguard.redact import redact_data

    if redact_data(facts) is not facts:
        return None  # a memo file holds no credential (the variables are kept as a digest)
    folders = _folders(facts)
    state = folders_state(folders)
    if key != interpreter_key(exe, env) or _touched_since(folders, state,
                                                          started_ns - RECENT_NS):
        return None
    return marshal_file.save(_path(exe, memo_root), TAG, {exe: (key, state, facts)})


_PATH_FACTS = ("executable", "prefix", "scripts")
_PATH_LISTS = ("sys_path", "site_packages")


def _same_site_files(folder: str, copy: str) -> bool:
    """Whether the folder ``copy`` holds what ``site`` reads in ``folder``: the same
    ``.pth`` files and site modules, each the same bytes or a symbolic link to ``folder``'s
    own file (how the metadata copy holds them: the link is read, never followed)."""
    import stat

    ours, theirs = _site_names(folder), _site_names(copy)
    if ours is None or theirs is None:
        return ours is None and theirs is None
    if ours != theirs:
        return False
    real = os.path.realpath(folder)
    try:
        for name in ours:
            there = os.path.join(copy, name)
            if stat.S_ISLNK(os.lstat(there).st_mode):
                if os.readlink(there) != os.path.join(real, name):
                    return False
            elif not _same_bytes(os.path.join(folder, name), there):
                return False
    except OSError:
        return False
    return True


def _same_bytes(ours: str, copy: str) -> bool:
    """Whether two small regular files hold the same bytes; False for anything else (a
    FIFO, a device, a file over 1 MiB: read without blocking or following a link in the
    copy, :func:`envguard.input_file.read_bounded`)."""
    from envguard.input_file import SMALL_FILE_BYTES, NotReadable, read_bounded

    try:
        return (read_bounded(ours, limit=SMALL_FILE_BYTES)
                == read_bounded(copy, limit=SMALL_FILE_BYTES, follow=False))
    except (OSError, NotReadable):
        return False


def moved(facts: dict[str, Any], copy_prefix: str) -> dict[str, Any] | None:
    """The answer a probe of a copy of ``facts``'s venv at ``copy_prefix`` would give, or
    None where that is not certain: the two must hold the same ``pyvenv.cfg`` and, in every
    folder of ``sys.path`` inside the venv, the same ``.pth`` files and site modules, byte
    for byte (folders absent from one are absent from the other). ``site`` then reads the
    same in both, and the paths it adds differ by the prefix alone. A ``.pth`` line that
    runs code imports the same module in both (the copy holds it), and is taken to do the
    same there. ``envguard install`` snapshots its scratch copy after the installer ran:
    unless the installer wrote a ``.pth`` file, this saves starting an interpreter."""
    prefix = str(facts.get("prefix") or "")
    if not prefix or not facts.get("is_venv"):
        return None

    if not _same_bytes(os.path.join(prefix, "pyvenv.cfg"),
                       os.path.join(copy_prefix, "pyvenv.cfg")):
        return None
    for folder in _folders(facts):
        there = rebased(folder, prefix, copy_prefix)
        if there != folder and not _same_site_files(folder, there):
            return None
    copied = dict(facts)
    for key in _PATH_FACTS:
        if isinstance(facts.get(key), str):
            copied[key] = rebased(facts[key], prefix, copy_prefix)
    for key in _PATH_LISTS:
        copied[key] = [rebased(str(p), prefix, copy_prefix) for p in facts.get(key) or []]
    return copied
