"""Edited installed files that other paths share by hard link, and uv's cache among them.

uv installs by hard link from its cache (``--link-mode hardlink``, its default on Linux):
the installed file, the cache's unpacked wheel (``archive-v0/ID/...``) and the same file in
every other venv linked from that copy are one inode. An edit written into the file in place
(a line appended, a file opened ``r+``) is an edit to all of them, and a reinstall links the
same edited inode back; only dropping the package from uv's cache first gives a clean copy.
An editor that writes a new file and renames it over the old one breaks the link instead:
the edit stays in this path, which then has one link and is not reported as shared.

The RECORD check already knows each differing file's link count (``st_nlink`` of its own
``stat``: :attr:`~envguard.probe.recordcheck.Checked.links`). Only for a file with more than
one link does :func:`mark_shared` look further, and only in uv's cache, found as uv finds it
(``UV_CACHE_DIR``, else ``$XDG_CACHE_HOME/uv``, else ``~/.cache/uv``; a ``cache-dir`` set in
uv.toml is not read): the same RECORD path under each ``archive-v0`` folder, compared by
device and inode. The work is bounded: the archive folder is listed once (at most
:data:`MAX_ARCHIVES` entries), each package is searched for once, its other files are
looked for only in the folder found for it, and no snapshot makes more than
:data:`MAX_STATS` stats here. Other venvs linked to the same copy are not searched for (that
would mean walking every venv on the machine); the link count says how many paths there are
beyond this one and the cache.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path

from envguard.model import Integrity, IntegrityIssue
from envguard.probe.distributions import InstalledDist

MAX_ARCHIVES = 5000
"""Entries of ``archive-v0`` looked into (one unpacked wheel each)."""
MAX_STATS = 20_000
"""Stats of cache paths, in all, per snapshot."""
ARCHIVES = "archive-v0"


def uv_cache_dir(env: Mapping[str, str]) -> Path | None:
    """uv's cache folder as uv resolves it from the environment: ``UV_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/uv`` (an absolute one), else ``~/.cache/uv``; None without a home."""
    explicit = env.get("UV_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    xdg = env.get("XDG_CACHE_HOME")
    if xdg and os.path.isabs(xdg):
        return Path(xdg) / "uv"
    home = env.get("HOME") or os.path.expanduser("~")
    return Path(home) / ".cache" / "uv" if os.path.isabs(home) else None


class _CacheSearch:
    """Where in uv's cache a file's inode is, within the module's bounds."""

    def __init__(self, root: Path) -> None:
        self.root = root / ARCHIVES
        self.archives: list[str] | None = None
        self.stats = 0
        self.found: dict[str, str | None] = {}
        """Package -> the archive folder its shared files were found in (None: not found)."""

    def _listing(self) -> list[str]:
        if self.archives is None:
            try:
                with os.scandir(self.root) as entries:
                    self.archives = sorted(e.path for _, e in zip(range(MAX_ARCHIVES), entries,
                                                                  strict=False))
            except OSError:
                self.archives = []
        return self.archives

    def _same(self, path: str, inode: tuple[int, int]) -> bool:
        self.stats += 1
        try:
            st = os.stat(path, follow_symlinks=False)
        except OSError:
            return False
        return (st.st_dev, st.st_ino) == inode

    def find(self, package: str, rel: str, inode: tuple[int, int]) -> str | None:
        """The archive folder holding ``rel`` with this (device, inode), or None."""
        if package in self.found:
            folder = self.found[package]
            return folder if folder and self._same(os.path.join(folder, rel), inode) else None
        found = None
        for folder in self._listing():
            if self.stats >= MAX_STATS:
                break
            if self._same(os.path.join(folder, rel), inode):
                found = folder
                break
        self.found[package] = found
        return found


def _plain(rel: str) -> bool:
    """A RECORD path inside site-packages (no ``..``, not absolute): what an archive holds."""
    return bool(rel) and not os.path.isabs(rel) and ".." not in rel.split("/")


def mark_shared(checked: Integrity, installed: list[InstalledDist],
                env: Mapping[str, str]) -> Integrity:
    """``checked`` with ``shared_with`` set on each issue whose file (more than one link)
    is the same inode as a file in uv's cache; unchanged when no issue has links."""
    if not any(i.links for i in checked.issues):
        return checked
    root = uv_cache_dir(env)
    search = _CacheSearch(root) if root is not None else None
    sites: dict[str, str] = {}
    for item in installed:
        sites.setdefault(item.dist.name, item.site_dir)
    issues: list[IntegrityIssue] = []
    for issue in checked.issues:
        site = sites.get(issue.package)
        if search is not None and issue.links and site is not None and _plain(issue.path):
            try:
                st = os.stat(os.path.join(site, issue.path))
            except OSError:
                issues.append(issue)
                continue
            folder = search.find(issue.package, issue.path, (st.st_dev, st.st_ino))
            if folder is not None:
                issue = dataclasses.replace(issue, shared_with=folder)
        issues.append(issue)
    return dataclasses.replace(checked, issues=issues)

