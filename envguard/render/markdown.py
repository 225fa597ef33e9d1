"""What every ``--format markdown`` renderer shares: inert text and a table."""

from __future__ import annotations

import re
from collections.abc import Sequence

from envguard.render.sanitize import clean

_SPECIAL = re.compile(r"([\\`*_\[\]<>|~])")
ICON = {"critical": "🔴", "warning": "🟡", "info": "🔵"}


def md(value: object, limit: int = 300) -> str:
    """Inert markdown text: control characters shown, markup characters escaped."""
    return _SPECIAL.sub(r"\\\1", clean(value, limit))


def _row(*cells: str) -> str:
    return "| " + " | ".join(cells) + " |"


def md_table(header: tuple[str, ...], rows: Sequence[tuple[str, ...]]) -> list[str]:
    """A Markdown table and the blank line after it."""
    return [_row(*header), _row(*("---",) * len(header)), *(_row(*r) for r in rows), ""]
