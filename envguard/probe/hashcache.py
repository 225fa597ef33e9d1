"""The old home of ``default_cache_root``, now :func:`envguard.paths.user_dir`.

Kept only until ``dflash.megacache`` imports :mod:`envguard.paths`; nothing in envguard
imports it. Delete it then.
"""

from __future__ import annotations

from envguard.paths import user_dir as default_cache_root

__all__ = ["default_cache_root"]
