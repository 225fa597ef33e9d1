"""Distribution names as PEP 503 compares them: one rule for every module that matches a
name from a snapshot, a lock, an error message or a knowledge-base entry."""

from __future__ import annotations

import re

_SEPARATORS = re.compile(r"[-_.]+")


def normalize_name(name: str) -> str:
    """``Foo_Bar.baz`` -> ``foo-bar-baz`` (PEP 503; what ``packaging.utils``'
    ``canonicalize_name`` returns, without importing ``packaging.tags`` and its ``logging``
    and ``platform`` into every command)."""
    return _SEPARATORS.sub("-", name).lower()
