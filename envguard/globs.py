"""Shell-style name patterns (``CUDA_*``, ``vllm*``, ``LD_PRELOAD``), matched as
:func:`fnmatch.fnmatchcase` matches them, without compiling a regular expression for the
common shapes: a plain name is compared, a name then one trailing ``*`` is a prefix.
Only the rest (``?``, ``[...]``, a ``*`` inside) goes to :mod:`fnmatch`. A passing gate
matches every variable of the environment against about 30 patterns; compiling them cost
about 2 ms of its start.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable

_SPECIAL = frozenset("*?[")


def matches_any(name: str, patterns: Iterable[str]) -> bool:
    """Whether ``name`` matches any of ``patterns`` (case-sensitive, as
    :func:`fnmatch.fnmatchcase`)."""
    for pattern in patterns:
        if _SPECIAL.isdisjoint(pattern):
            if name == pattern:
                return True
        elif pattern.endswith("*") and _SPECIAL.isdisjoint(pattern[:-1]):
            if name.startswith(pattern[:-1]):
                return True
        elif fnmatch.fnmatchcase(name, pattern):
            return True
    return False
