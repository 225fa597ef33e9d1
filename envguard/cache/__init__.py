"""Archives of torch's and triton's compile caches (``envguard cache``), and their provenance.

- :mod:`envguard.cache.manifest`: the archive manifest, and reading a store of archives;
- :mod:`envguard.cache.store`: the caches' states, saving and restoring archives;
- :mod:`envguard.cache.tar`: tar files of a cache tree, written and extracted safely;
- :mod:`envguard.cache.provenance`: the marker naming the builds that filled a cache,
  written only where envguard fills or restores one. :func:`mark` (``envguard.cache.mark``)
  is what a trainer calls after warming a cache itself.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from envguard.cache.provenance import mark as mark

__all__ = ["mark"]


def __getattr__(name: str) -> Any:
    if name == "mark":  # lazy: importing envguard.cache stays cheap
        from envguard.cache.provenance import mark

        return mark
    raise AttributeError(f"module 'envguard.cache' has no attribute {name!r}")
