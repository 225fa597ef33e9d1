"""The metadata copy of a venv as a plan of entries, made anew or brought up to date in
place, so that the copy is kept between predictions.

:func:`clone_plan` says what :func:`~envguard.install.scratch.metadata_clone` makes:
``pyvenv.cfg`` copied, the interpreter hard linked, and symbolic links to the venv's
metadata files, in the folders that hold them. Making them costs an inode each, a few
hundred for a hundred packages, and on some disks (network and overlay filesystems, and this
project's VM, where a new folder's first inodes cost 10-20 times more at random) that was
most of a prediction's time. So the copy stays at its one name after a prediction, and the
next one :func:`realize`\\ s the plan on it: each entry is checked (a link's target, a hard
link's inode, a copied file's bytes: reads only) and made only where it differs; what the
plan does not hold is removed. After a prediction, :func:`prune` moves aside what the
installer wrote (one rename for each entry the copy was not made with, such as a new
package's whole tree), for removal in the background.

The copy is envguard's own state: nothing in it is followed. Its entries are read with
``lstat``, an entry of the wrong kind (a link where a folder belongs) is removed and made
again, and a folder is never entered through a link.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from envguard.frozen import frozen
from envguard.paths import rebased

DIR, LINK, SYMLINK, HARD, COPY, TEXT = "dir", "link", "symlink", "hard", "copy", "text"
"""An entry's kind: a folder; a symbolic link to the venv's file ``source`` (guarded); a
link copied as a link (``source`` is its target); a hard link to ``source`` (guarded;
copied where a link cannot be made); a copy of ``source``; a file of envguard's own
holding ``source``."""
IGNORE_ALL = "# envguard install's copy of the venv beside it: not a project file\n*\n"
"""The copy's ``.gitignore``: it is kept beside the venv, often in a project's folder,
where git, and the tools that honour ``.gitignore`` (ruff among them), leave it alone."""
_COPY_LIMIT = 1 << 20
"""A copied file larger than this is made again rather than compared."""
_PTH_IMPORT = re.compile(r"(?:__import__\(\s*['\"]|\bimport\s+)([A-Za-z_][A-Za-z0-9_]*)")
_COPIED_DIRS = frozenset({"bin", "Scripts"})


@frozen(kw_only=False)
class Entry:
    kind: str
    source: str = ""
    mode: int = 0o755
    """A folder's mode."""


class Guard(Protocol):
    """What is told of each linked file (:class:`~envguard.install.scratch.LinkGuard`)."""

    def add(self, path: str, st: os.stat_result) -> None: ...


Plan = dict[str, Entry]
"""Entries by path relative to the copy, each folder before what it holds."""


FileKey = tuple[int, int, int, bool]
"""(inode, size, modification time in ns, is a symlink) of one entry of the copy."""


@frozen
class Cloned:
    """What a copy cost: files linked and copied (made now or kept), the bytes copied."""

    linked: int
    copied: int
    copied_bytes: int
    kept: int = 0
    """Entries of a kept copy found up to date (none made for them)."""
    made: dict[str, FileKey] = dataclasses.field(default_factory=dict)
    """A metadata copy's :func:`inventory` once made (empty for a whole copy)."""


def _key(st: os.stat_result) -> FileKey:
    return (st.st_ino, st.st_size, st.st_mtime_ns, stat.S_ISLNK(st.st_mode))


def file_key(path: str) -> FileKey | None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    return _key(st)


def inventory(folder: str) -> dict[str, FileKey]:
    """Every file and symlink under ``folder`` (symlinks not followed), by relative path."""
    out: dict[str, FileKey] = {}
    stack = [("", folder)]
    while stack:
        rel, path = stack.pop()
        with os.scandir(path) as entries:
            for entry in entries:
                sub = f"{rel}{entry.name}"
                if entry.is_dir(follow_symlinks=False):
                    stack.append((sub + "/", entry.path))
                    continue
                out[sub] = _key(entry.stat(follow_symlinks=False))
    return out


def link_target(path: str, real_src: str, dst: str) -> str:
    """A symlink's target in the copy: one that leads into the environment (absolute)
    leads into the copy instead; relative ones and those outside stay."""
    target = os.readlink(path)
    if os.path.isabs(target):
        real = os.path.normpath(target)
        if (there := rebased(real, real_src, dst)) != real:
            return there
    return target


def is_metadata(rel_parts: tuple[str, ...], name: str) -> bool:
    """Files a whole copy copies rather than links (the installer rewrites them)."""
    return (any(p.endswith((".dist-info", ".egg-info")) for p in rel_parts)
            or name.endswith(".pth") or name == "pyvenv.cfg"
            or (bool(rel_parts) and rel_parts[0] in _COPIED_DIRS))


def clone_plan(prefix: Path, dst: Path, site_packages: Sequence[str], *,
               with_pip: bool) -> Plan:
    """The entries of the venv at ``prefix``'s metadata copy at ``dst`` (the module)."""
    plan: Plan = {".gitignore": Entry(TEXT, IGNORE_ALL)}
    real_src = os.path.realpath(prefix)
    if os.path.isfile(prefix / "pyvenv.cfg"):
        plan["pyvenv.cfg"] = Entry(COPY, str(prefix / "pyvenv.cfg"))
    for folder in ("bin", "Scripts"):
        if (prefix / folder).is_dir() and not (prefix / folder).is_symlink():
            plan[folder] = Entry(DIR)
            for entry in os.scandir(prefix / folder):
                if entry.name.startswith("python"):
                    _file(plan, f"{folder}/{entry.name}", entry.path, real_src, str(dst),
                          kind=HARD)
    for top in os.scandir(prefix):
        if top.is_symlink() and top.name.startswith("lib"):  # lib64 -> lib
            plan[top.name] = Entry(SYMLINK, link_target(top.path, real_src, str(dst)))
    for site in dict.fromkeys(os.path.realpath(p) for p in site_packages):
        if not site.startswith(real_src + os.sep) or not os.path.isdir(site):
            continue
        out = os.path.relpath(site, real_src)
        _folders(plan, out)
        modules = {"pip"} if with_pip else set()
        for entry in os.scandir(site):
            if entry.is_symlink():
                continue
            rel = f"{out}/{entry.name}"
            if entry.is_dir() and entry.name.endswith((".dist-info", ".egg-info")):
                _tree(plan, entry.path, rel, real_src, str(dst), link_metadata=True)
            elif entry.is_file() and entry.name.endswith((".pth", ".egg-link")):
                _file(plan, rel, entry.path, real_src, str(dst))
                if entry.name.endswith(".pth"):
                    text = Path(entry.path).read_text("utf-8", "replace")
                    modules |= set(_PTH_IMPORT.findall(text))
        version_py = os.path.join(site, "torch", "version.py")
        if os.path.isfile(version_py) and not os.path.islink(version_py):
            _folders(plan, f"{out}/torch")
            _file(plan, f"{out}/torch/version.py", version_py, real_src, str(dst))
        for module in sorted(modules):
            for candidate in (os.path.join(site, module), os.path.join(site, f"{module}.py")):
                if os.path.islink(candidate):
                    continue
                name = os.path.basename(candidate)
                if os.path.isdir(candidate):
                    _tree(plan, candidate, f"{out}/{name}", real_src, str(dst),
                          link_metadata=False)
                elif os.path.isfile(candidate):
                    _file(plan, f"{out}/{name}", candidate, real_src, str(dst))
    return plan


def _folders(plan: Plan, rel: str) -> None:
    parts = rel.split("/")
    for n in range(1, len(parts) + 1):
        plan.setdefault("/".join(parts[:n]), Entry(DIR))


def _file(plan: Plan, rel: str, path: str, real_src: str, dst: str, *,
          kind: str = LINK) -> None:
    """One file: a link copied as a link, else linked (``kind``)."""
    if os.path.islink(path):
        plan[rel] = Entry(SYMLINK, link_target(path, real_src, dst))
    else:
        plan[rel] = Entry(kind, path)


def _tree(plan: Plan, src: str, rel: str, real_src: str, dst: str, *,
          link_metadata: bool) -> None:
    """A folder of the venv, ``__pycache__`` left out: its folders (with their modes), its
    links as links, its files linked (``link_metadata`` false: the files
    :func:`is_metadata` names copied)."""
    plan[rel] = Entry(DIR)
    for folder, dirs, files in os.walk(src):
        sub = os.path.relpath(folder, src)
        parts = () if sub == "." else tuple(Path(sub).parts)
        here = rel if sub == "." else f"{rel}/{'/'.join(parts)}"
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for name in [*dirs, *files]:
            path = os.path.join(folder, name)
            st = os.lstat(path)
            if stat.S_ISLNK(st.st_mode):
                plan[f"{here}/{name}"] = Entry(SYMLINK, link_target(path, real_src, dst))
                if name in dirs:
                    dirs.remove(name)  # not walked: a link, copied as one
            elif name in dirs:
                plan[f"{here}/{name}"] = Entry(DIR, mode=st.st_mode & 0o7777 | 0o700)
            elif link_metadata or not is_metadata(parts, name):
                plan[f"{here}/{name}"] = Entry(LINK, path)
            else:
                plan[f"{here}/{name}"] = Entry(COPY, path)


def realize(plan: Plan, dst: Path, guard: Guard) -> Cloned:
    """Make ``plan`` at ``dst``: all of it where ``dst`` is new, else only the entries that
    differ from the plan, removing what it does not hold. ``guard`` (a
    :class:`~envguard.install.scratch.LinkGuard`) is told of every linked file. The
    result's ``made`` is the copy's :func:`inventory` (from this walk, not another)."""
    counts = [0, 0, 0, 0]
    made: dict[str, FileKey] = {}
    existing = _walk(str(dst)) if os.path.isdir(dst) else {}
    if not existing and not os.path.isdir(dst):
        os.mkdir(dst, 0o755)
    for rel, entry in plan.items():
        path = os.path.join(dst, rel)
        have = existing.pop(rel, None)
        if have is not None and _same(have, entry, path):
            counts[3] += 1
            _count(entry, path, guard, counts, made=False)
            if entry.kind != DIR:
                made[rel] = have[2]
            continue
        if have is not None:
            _remove(path)
        _make(entry, path, guard, counts)
        if entry.kind != DIR:
            made[rel] = _key(os.lstat(path))
    for rel in sorted(existing, key=lambda r: r.count("/"), reverse=True):
        _remove(os.path.join(dst, rel))  # the plan holds it no more
    return Cloned(linked=counts[0], copied=counts[1], copied_bytes=counts[2], kept=counts[3],
                  made=made)


def _walk(root: str) -> dict[str, tuple[str, str | int, FileKey]]:
    """Every entry under ``root`` by relative path: (DIR, "", key), (SYMLINK, its target,
    key) or (COPY, its inode, key) for a regular file, (``"other"``, "", key) for anything
    else; links are never followed."""
    out: dict[str, tuple[str, str | int, FileKey]] = {}
    stack = [""]
    while stack:
        rel = stack.pop()
        with os.scandir(os.path.join(root, rel) if rel else root) as entries:
            for entry in entries:
                name = f"{rel}/{entry.name}" if rel else entry.name
                st = entry.stat(follow_symlinks=False)
                if stat.S_ISDIR(st.st_mode):
                    out[name] = (DIR, "", _key(st))
                    stack.append(name)
                elif stat.S_ISLNK(st.st_mode):
                    out[name] = (SYMLINK, os.readlink(entry.path), _key(st))
                elif stat.S_ISREG(st.st_mode):
                    out[name] = (COPY, st.st_ino, _key(st))
                else:
                    out[name] = ("other", "", _key(st))
    return out


def _same(have: tuple[str, str | int, FileKey], entry: Entry, path: str) -> bool:
    kind, what, _ = have
    if entry.kind == DIR:
        return kind == DIR
    if entry.kind in (LINK, SYMLINK):
        return kind == SYMLINK and what == entry.source
    if kind != COPY:
        return False
    try:
        if entry.kind == TEXT:
            with open(path, "rb") as f:
                return f.read(len(entry.source) + 1) == entry.source.encode()
        if entry.kind == HARD:
            return os.lstat(entry.source).st_ino == what
        mine, theirs = os.lstat(path), os.lstat(entry.source)
        if mine.st_size != theirs.st_size or mine.st_size > _COPY_LIMIT:
            return False
        with open(path, "rb") as a, open(entry.source, "rb") as b:
            return a.read() == b.read()
    except OSError:
        return False


def _count(entry: Entry, path: str, guard: Guard, counts: list[int], *, made: bool) -> None:
    if entry.kind in (LINK, HARD):
        try:
            st = os.lstat(entry.source)
        except OSError:
            return
        guard.add(entry.source, st)
        counts[0] += 1
    elif entry.kind == COPY:
        counts[1] += 1
        if made:
            counts[2] += os.lstat(path).st_size


def _make(entry: Entry, path: str, guard: Guard, counts: list[int]) -> None:
    if entry.kind == DIR:
        os.mkdir(path, entry.mode)
        return
    if entry.kind == SYMLINK:
        os.symlink(entry.source, path)
        return
    if entry.kind == TEXT:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(entry.source)
        return
    if entry.kind in (LINK, HARD):
        try:
            if entry.kind == LINK:
                os.symlink(entry.source, path)
            else:
                os.link(entry.source, path, follow_symlinks=False)
        except OSError:
            entry = Entry(COPY, entry.source)
        else:
            _count(entry, path, guard, counts, made=True)
            return
    shutil.copy2(entry.source, path, follow_symlinks=False)
    _count(entry, path, guard, counts, made=True)


def _remove(path: str) -> None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(path, ignore_errors=True)
    else:
        os.unlink(path)


def prune(root: Path, made: dict[str, FileKey], aside: Path) -> int:
    """Move every entry under ``root`` that the copy was not made with (``made``: its
    :func:`inventory` then; an entry there now with another key is another file) into the
    folder ``aside`` (made here when needed), the highest such entry in one rename; how
    many were moved. Folders holding what was made stay."""
    folders: set[str] = set()
    for rel in made:
        parts = rel.split("/")[:-1]
        folders.update("/".join(parts[:n]) for n in range(1, len(parts) + 1))
    moved = 0
    stack = [""]
    while stack:
        rel = stack.pop()
        with os.scandir(os.path.join(root, rel) if rel else root) as entries:
            found = list(entries)
        for entry in found:
            name = f"{rel}/{entry.name}" if rel else entry.name
            if entry.is_dir(follow_symlinks=False):
                if name in folders:
                    stack.append(name)
                    continue
            elif name in made and file_key(entry.path) == made[name]:
                continue
            if not moved:
                os.makedirs(aside, 0o700, exist_ok=True)
            os.rename(entry.path, os.path.join(aside, str(moved)))
            moved += 1
    return moved
