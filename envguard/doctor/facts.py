"""The facts a doctor needs beyond the snapshot: the CUDA libraries the dynamic loader
finds through ``LD_LIBRARY_PATH`` and ``LD_PRELOAD`` (one directory listing each), and
the history read from the disk (:mod:`envguard.history.collect`)."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Mapping
from pathlib import Path

from envguard.doctor.interface import LibraryCopy, Scene, Shadow
from envguard.history.collect import read_timeline
from envguard.model import Snapshot
from envguard.probe.discovery import Selection
from envguard.probe.options import SnapshotOptions

WATCHED = ("cudart", "cublas", "cublasLt", "cudnn", "nccl", "cufft", "cusparse", "cusparseLt",
           "cusolver", "curand", "nvrtc", "nvJitLink", "cupti")
_SONAME = re.compile(r"^lib(" + "|".join(WATCHED) + r")\.so(?:\.(\d+))?(?:\.[\d.]+)?$")
MAX_ENTRIES = 10_000
"""Names read per folder at most (a huge folder on LD_LIBRARY_PATH is not scanned whole)."""


def _parse(file: str) -> tuple[str, int | None] | None:
    found = _SONAME.match(file)
    if not found:
        return None
    return found.group(1), int(found.group(2)) if found.group(2) else None


def cuda_libraries(env: Mapping[str, str]) -> Iterator[LibraryCopy]:
    """CUDA libraries in the folders of ``LD_LIBRARY_PATH`` (in order) and the files of
    ``LD_PRELOAD``; unreadable folders are skipped."""
    for folder in env.get("LD_LIBRARY_PATH", "").split(":"):
        if not folder:
            continue
        try:
            with os.scandir(folder) as entries:
                names = []
                for n, entry in enumerate(entries):
                    if n >= MAX_ENTRIES:
                        break
                    names.append(entry.name)
        except OSError:
            continue
        for name in sorted(names):
            parsed = _parse(name)
            if parsed is not None:
                yield LibraryCopy(variable="LD_LIBRARY_PATH", folder=folder, file=name,
                                  library=parsed[0], major=parsed[1])
    for item in re.split(r"[:\s]+", env.get("LD_PRELOAD", "")):
        if not item:
            continue
        parsed = _parse(os.path.basename(item))
        if parsed is not None:
            yield LibraryCopy(variable="LD_PRELOAD", folder=os.path.dirname(item),
                              file=os.path.basename(item), library=parsed[0],
                              major=parsed[1])


def snapshot_options(selection: Selection, *, verify: str = "size", cwd: Path | None = None,
                     env: Mapping[str, str] | None = None) -> SnapshotOptions:
    """What ``envguard doctor`` and ``envguard history`` snapshot (the CLI and the API
    alike): the chosen environment, its files against RECORD, no git, no project config,
    no sighting remembered."""
    return SnapshotOptions(python=selection.python, selected_by=selection.selected_by,
                           verify=verify, cwd=cwd or Path.cwd(), env=env, git=False,
                           use_project_config=False, remember_caches=False)


_MODULE_FILE = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)(?:\.py|\.pyc|(?:\.[\w-]+)?\.so)$")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SITE = re.compile(r"python(\d+\.\d+)[/\\]site-packages[/\\]?$")


def importable(folder: str) -> tuple[str, ...]:
    """The top-level modules a folder on ``sys.path`` provides: ``x.py``, ``x.so``, a folder
    ``x`` holding Python files (at most :data:`MAX_ENTRIES` names read; links are not
    followed into; an unreadable folder provides nothing)."""
    found: list[str] = []
    try:
        with os.scandir(folder) as entries:
            for n, entry in enumerate(entries):
                if n >= MAX_ENTRIES:
                    break
                module = _MODULE_FILE.match(entry.name)
                if module and entry.is_file(follow_symlinks=False):
                    found.append(module.group(1))
                elif (_NAME.match(entry.name) and entry.is_dir(follow_symlinks=False)
                      and os.path.exists(os.path.join(entry.path, "__init__.py"))):
                    found.append(entry.name)
    except OSError:
        return ()
    return tuple(sorted(set(found)))


def shadows(cwd: Path | None, env: Mapping[str, str]) -> Iterator[Shadow]:
    """The working folder (``python -c`` and ``python -m`` import from it first) and each
    ``PYTHONPATH`` folder, with what each provides."""
    if cwd is not None:
        yield Shadow(folder=str(cwd), source="working folder", modules=importable(str(cwd)))
    for folder in env.get("PYTHONPATH", "").split(os.pathsep):
        if folder:
            site = _SITE.search(folder)
            yield Shadow(folder=folder, source="PYTHONPATH", modules=importable(folder),
                         site_python=site.group(1) if site else None)


def gather(snapshot: Snapshot, *, env: Mapping[str, str] | None = None,
           cwd: Path | None = None) -> Scene:
    """Everything the doctor's rules read, for ``snapshot``'s environment. ``env``: the
    variables the job would run with (default: this process's); ``cwd``: the folder it
    runs in."""
    variables = os.environ if env is None else env
    return Scene(snapshot=snapshot, timeline=read_timeline(snapshot, cwd=cwd),
                 libraries=tuple(cuda_libraries(variables)),
                 gpus_present=bool(snapshot.system.gpus),
                 shadows=tuple(shadows(cwd, variables)))
