"""Make untrusted strings safe to show on a terminal.

Paths, package names and environment values come from the environment being
inspected and may hold terminal escape sequences or rich markup. Renderers put
them into ``rich.text.Text`` objects (never markup) after :func:`clean`.
"""

from __future__ import annotations

import re

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_INVISIBLE = re.compile("[\u061c\u200b-\u200f\u202a-\u202e\u2060-\u2069\ufeff]")
"""Characters that change how the text around them reads without being seen: the bidi
embeddings, overrides and isolates (U+202A-U+202E, U+2066-U+2069), the direction marks
(U+200E, U+200F, U+061C) and the zero-width ones (U+200B-U+200D, U+2060, U+FEFF); with
the invisible operators U+2061-U+2064 in the range between."""


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def escape_controls(text: str) -> str:
    """``text`` with every control character shown as ``\\xNN`` and every bidi or
    zero-width character as ``\\uNNNN``: what every renderer and every CLI line does to
    text from the environment (line breaks and tabs are the caller's to decide)."""
    text = _CONTROL.sub(_escape, text)
    return _INVISIBLE.sub(_escape, text) if not text.isascii() else text


def escape_invisible(text: str) -> str:
    """``text`` with only its bidi and zero-width characters escaped: the last net of
    the CLI over a whole rendered output (whose colours are control characters)."""
    return text if text.isascii() else _INVISIBLE.sub(_escape, text)


REASON_LIMIT = 1000
"""How much of a reason or a detail is shown: paths run long in them (a temporary folder,
a kept build's digest), and the end says why."""


def clean(value: object, limit: int = 500) -> str:
    """One printable line: control, bidi and zero-width characters shown as ``\\xNN`` or
    ``\\uNNNN`` (:func:`escape_controls`), long values cut."""
    text = escape_controls(str(value).replace("\n", "\\n").replace("\t", " "))
    return text if len(text) <= limit else text[: limit - 1] + "…"


def clean_path(value: object, limit: int = 120) -> str:
    """Like :func:`clean`, but a long path keeps its informative end: ``…/site-packages/x``.
    A path the user named (``--store``, ``--into``) is redacted here too: it never passed
    through a snapshot."""
    from envguard.redact import redact_text

    text = clean(redact_text(str(value)), limit=10_000)
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
