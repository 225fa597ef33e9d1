"""Text for a stdout whose encoding cannot hold all of it (``PYTHONIOENCODING=ascii``, a
latin-1 locale): ASCII stand-ins for envguard's own symbols and rich's box drawing."""

from __future__ import annotations

import functools

_STAND_INS = {"→": "->", "←": "<-", "…": "...", "–": "-", "—": "--", "·": "-", "•": "*",
              "×": "x", "≠": "!=", "≤": "<=", "≥": ">=", "▶": ">", "✓": "ok", "✗": "x",
              "“": '"', "”": '"', "‘": "'", "’": "'", "🔴": "[!]", "🟡": "[~]", "🔵": "[i]"}


@functools.cache
def _ascii_table() -> dict[int, str]:
    """ASCII stand-ins for envguard's own symbols and rich's box drawing (U+2500-U+257F)."""
    import unicodedata

    table = {ord(k): v for k, v in _STAND_INS.items()}
    for code in range(0x2500, 0x2580):
        name = unicodedata.name(chr(code), "")
        if " AND " in name or " ARC " in name:
            table[code] = "+"  # corners and junctions
        elif "HORIZONTAL" in name or name.endswith(("LEFT", "RIGHT")):
            table[code] = "-"
        else:
            table[code] = "|" if "VERTICAL" in name or name.endswith(("UP", "DOWN")) else "+"
    table.update({0x2571: "/", 0x2572: "\\", 0x2573: "X"})  # the diagonals
    return table


def encodable(text: str, encoding: str | None) -> str:
    """``text``, or where ``encoding`` cannot hold it, with ASCII stand-ins and ``?`` for
    anything else (a package name in another script)."""
    try:
        text.encode(encoding or "utf-8")
        return text
    except UnicodeEncodeError:
        pass
    except LookupError:  # an encoding Python does not know: leave it to the stream
        return text
    enc = encoding or "utf-8"
    return text.translate(_ascii_table()).encode(enc, errors="replace").decode(enc)
