"""What an installer's uninstalls on the scratch copy remove from the environment itself:
read from the copy (which metadata the installer took away) and from the environment's own
RECORD files (which files each distribution it uninstalled has there), as installers
uninstall: every RECORD row inside the environment, the ``__pycache__`` files of its
``.py`` files, the metadata folder. :mod:`envguard.install.transplant` moves them aside.
"""

from __future__ import annotations

import os

from envguard.errors import EnvguardError
from envguard.exitcodes import ExitCode
from envguard.install.skeleton import FileKey, file_key

META = (".dist-info", ".egg-info")


class TransplantFailed(EnvguardError):
    """The predicted files could not be moved into place; the environment is as it was."""

    exit_code = ExitCode.ENVIRONMENT_ERROR


def inside(prefix: str, path: str) -> bool:
    return path.startswith(prefix + os.sep)


def touched(folder: str, before: dict[str, FileKey]) -> set[str]:
    """The entries the copy at ``folder`` was made with (``before``) that the installer
    removed or replaced."""
    return {rel for rel, key in before.items() if file_key(os.path.join(folder, rel)) != key}


def removals(prefix: str, folder: str, gone: set[str]) -> dict[str, None]:
    """Absolute paths in the environment at ``prefix`` that the installer's uninstalls on
    the copy at ``folder`` remove (``gone``: :func:`touched`), in order; the metadata
    folders of uninstalled distributions among them."""
    removed: dict[str, None] = {}
    for meta in sorted({rel.rsplit("/", 1)[0] for rel in gone if "/" in rel}):
        if not meta.endswith(META) or (meta.endswith(".dist-info")
                                        and f"{meta}/RECORD" not in gone):
            continue  # a file of a distribution that stays (the installer rewrote it)
        if meta.endswith(".egg-info"):
            raise TransplantFailed(f"the installer removed {meta}, a legacy egg-info "
                                   "distribution whose files only the installer can list")
        for path in record_paths(prefix, meta):
            removed[path] = None
        removed[os.path.join(prefix, meta)] = None
    for rel in gone:  # anything else the installer took out of the copy
        path = os.path.join(prefix, rel)
        if file_key(os.path.join(folder, rel)) is None and path not in removed:
            removed[path] = None
    return removed


def whole_folders(removed: dict[str, None], sites: tuple[str, ...]) -> list[str]:
    """Folders right below a site-packages folder that hold nothing but removed files (and
    no empty folder): moved aside in one step each instead of file by file."""
    tops: dict[str, None] = {}
    starts = [site + os.sep for site in sites]
    for path in removed:
        for start in starts:
            if path.startswith(start):
                tops[start + path[len(start):].partition(os.sep)[0]] = None
    whole = []
    for top in tops:
        if top in removed and top.endswith(META):
            whole.append(top)
            continue
        if os.path.islink(top) or not os.path.isdir(top):
            continue
        if only_removed(top, removed):
            whole.append(top)
    return whole


def only_removed(top: str, removed: dict[str, None]) -> bool:
    """Whether every file below ``top`` is removed, with no link to a folder and no empty
    folder (an installer leaves a folder it does not empty)."""
    stack = [top]
    while stack:
        with os.scandir(stack.pop()) as entries:
            empty = True
            for entry in entries:
                empty = False
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
                elif entry.path not in removed:
                    return False
            if empty:
                return False
    return True


def record_paths(prefix: str, meta: str) -> list[str]:
    """What uninstalling the distribution of ``meta`` removes from the environment: its
    RECORD's files inside ``prefix`` (their folder too, links resolved: a row through a
    link that leads out is left alone), their ``__pycache__`` files, the metadata
    folder's."""
    from envguard.input_file import NotReadable
    from envguard.probe.recordfile import record_rows

    folder = os.path.join(prefix, meta)
    site = os.path.dirname(folder)
    try:
        rows = record_rows(os.path.join(folder, "RECORD"))
    except (OSError, NotReadable) as exc:
        raise TransplantFailed(f"{meta}/RECORD cannot be read ({exc}): the files of the "
                               "distribution it replaces are unknown") from None
    out: list[str] = []
    caches: dict[str, list[str]] = {}
    real: dict[str, bool] = {}  # a folder: whether it lies inside prefix, links resolved
    sep = os.sep
    for row in rows:
        rel = row[0]
        # a plain relative row (most of them) needs no normpath; "..", "." or "//" does
        plain = (rel and not rel.startswith(sep) and ".." not in rel and sep * 2 not in rel
                 and f"{sep}.{sep}" not in f"{sep}{rel}{sep}" and not rel.endswith(sep))
        path = f"{site}{sep}{rel}" if plain else os.path.normpath(os.path.join(site, rel))
        parent, _, name = path.rpartition(sep)
        if parent not in real:
            real[parent] = _resolves_inside(prefix, parent, real)
        if not real[parent] or not inside(prefix, path):
            continue
        out.append(path)
        if name.endswith(".py"):
            cache = f"{parent}{sep}__pycache__"
            if cache not in caches:
                try:
                    caches[cache] = os.listdir(cache)
                except OSError:
                    caches[cache] = []
            if caches[cache]:
                stem = name[:-3] + "."
                out += [f"{cache}{sep}{n}" for n in caches[cache]
                        if n.startswith(stem) and n.endswith(".pyc")]
    for folder_path, _dirs, files in os.walk(folder):
        out += [os.path.join(folder_path, n) for n in files]
    return out


def _resolves_inside(prefix: str, folder: str, known: dict[str, bool]) -> bool:
    """Whether ``folder`` is ``prefix`` or lies inside it with links resolved, as
    ``realpath`` says, with one ``lstat`` for a folder that is no link: its place is then
    its parent's (``known`` keeps the parents' answers). A link, or a parent that resolves
    outside, is left to ``realpath``."""
    if folder == prefix:
        return True
    if inside(prefix, folder) and not os.path.islink(folder):
        parent = os.path.dirname(folder)
        if parent not in known:
            known[parent] = _resolves_inside(prefix, parent, known)
        if known[parent]:
            return True
    real = os.path.realpath(folder)
    return real == prefix or inside(prefix, real)
