"""Make untrusted strings safe to show on a terminal.

Paths, package names and environment values come from the environment being
inspected and may hold terminal escape sequences or rich markup. Renderers put
them into ``rich.text.Text`` objects (never markup) after :func:`clean`.
"""

from __future__ import annotations

import re

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def clean(value: object, limit: int = 500) -> str:
    """One printable line: control characters shown as ``\\xNN``, long values cut."""
    text = str(value).replace("\n", "\\n").replace("\t", " ")
    text = _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def clean_path(value: object, limit: int = 120) -> str:
    """Like :func:`clean`, but a long path keeps its informative end: ``…/site-packages/x``."""
    text = clean(value, limit=10_000)
    return text if len(text) <= limit else "…" + text[-(limit - 1):]


def display_value(v: object) -> str:
    """A changed value in one line: lists joined, dicts as ``key value`` pairs, None as ``–``."""
    if v is None:
        return "–"
    if isinstance(v, dict):
        return ", ".join(f"{k} {v[k]}" for k in sorted(v))
    if isinstance(v, list):
        return ", ".join(map(str, v)) or "–"
    return str(v)
