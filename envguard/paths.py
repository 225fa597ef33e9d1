"""envguard's own folders, in one place.

Per user (``user_dir``): ``$ENVGUARD_CACHE_DIR``, else ``$XDG_CACHE_HOME/envguard``, else
``~/.cache/envguard``. It holds envguard's memo files (digests, parsed RECORDs, GPU facts,
dependency closures: each only saves time and may be deleted) and the default store of
compile-cache archives (``compile-caches/``). The compile caches themselves are torch's
and triton's, wherever those put them.

Per project, under the working directory: ``.envguard/snapshots`` (``envguard snapshot``;
``by-digest/`` the snapshots of guarded runs, stored once by content), ``.envguard/runs``
(``envguard run``: one record per run and the ``last-good.json`` pointer) and
``.envguard/fleet`` (``envguard fleet snapshot``).
"""

from __future__ import annotations

import os
from pathlib import Path

PROJECT_DIR = Path(".envguard")
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

