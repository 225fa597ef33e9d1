"""Compiled bytecode under ``PYTHONDONTWRITEBYTECODE``, kept in a tool's own cache folder.

Images often set ``PYTHONDONTWRITEBYTECODE=1``, and installers such as uv do not compile
by default, so every start of a command compiles its modules from source again: 80-90 ms
of envguard's gate on a 2-core VM; for ``dflash-train`` on the H200 image (whose torch
ships no ``.pyc``), torch, transformers, dynamo and inductor, seconds of every launch.
:func:`keep_bytecode` points ``sys.pycache_prefix`` at a folder of the tool's cache, so
the first start compiles and later ones read.

Only the calling process changes: a guarded command, a torchrun worker or a subprocess
starts with the environment it was given. Nothing changes where the install shipped its
bytecode, where the user allows bytecode, where ``PYTHONPYCACHEPREFIX`` is set, or with
``ENVGUARD_NO_BYTECODE_CACHE=1``. Python writes each ``.pyc`` atomically, so processes
starting together (torchrun's ranks) share the folder safely.

A ``.pyc`` in the folder runs as this user's code, so the folder is used only when it is
private (:func:`envguard.paths.private_folder`: made 0700, owned by this user, not writable
by group or others, nor is its parent): one another user could write to is skipped, and
the modules compile from source as they would have without it.
"""

from __future__ import annotations

import contextlib
import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from types import CodeType

from envguard.paths import private_folder

OPT_OUT_ENV = "ENVGUARD_NO_BYTECODE_CACHE"


def keep_bytecode(folder: Path, shipped: str | None,
                  env: Mapping[str, str] | None = None) -> bool:
    """Compile into ``folder`` from now on, if bytecode is off and ``shipped`` (a module's
    source file whose ``.pyc`` an install that compiles would have written) has none.
    Returns whether anything changed (not when ``folder`` is not private). Call it before
    the heavy imports."""
    env = os.environ if env is None else env
    if not sys.dont_write_bytecode or env.get(OPT_OUT_ENV) or sys.pycache_prefix is not None:
        return False
    if shipped is None or os.path.exists(importlib.util.cache_from_source(shipped)):
        return False
    if not private_folder(folder, parents=1):
        return False  # why: in envguard.paths.DISTRUSTED
    sys.pycache_prefix = str(folder)
    sys.dont_write_bytecode = False
    _tolerate_broken_bytecode()
    return True


class _TolerantSourceLoader(importlib.machinery.SourceFileLoader):
    """The standard loader, except that a cached ``.pyc`` that does not unmarshal (cut
    short by a full disk or a killed machine; the header still matches) is dropped and
    the module compiled from source, instead of the import failing with EOFError."""

    def get_code(self, fullname: str) -> CodeType | None:
        try:
            return super().get_code(fullname)
        except (EOFError, ValueError, TypeError):  # marshal: too short, bad data
            cached = importlib.util.cache_from_source(self.path)
            with contextlib.suppress(OSError):
                os.unlink(cached)
            return self.source_to_code(self.get_data(self.path), self.path)


def _tolerate_broken_bytecode() -> None:
    """Find modules with :class:`_TolerantSourceLoader` from now on (the bytecode in the
    folder :func:`keep_bytecode` chose is this tool's own, and must never stop it)."""
    machinery = importlib.machinery
    hook = machinery.FileFinder.path_hook(
        (machinery.ExtensionFileLoader, machinery.EXTENSION_SUFFIXES),
        (_TolerantSourceLoader, machinery.SOURCE_SUFFIXES),
        (machinery.SourcelessFileLoader, machinery.BYTECODE_SUFFIXES))
    sys.path_hooks.insert(0, hook)
    sys.path_importer_cache.clear()
