"""Writing TOML values by hand (lockfiles, pylock.toml): the stdlib only reads TOML."""

from __future__ import annotations

import re


def toml_string(value: str) -> str:
    """A TOML basic string: quotes and backslashes escaped, control characters as \\uXXXX."""
    out = value.replace("\\", "\\\\").replace('"', '\\"')
    out = re.sub(r"[\x00-\x1f\x7f]", lambda m: f"\\u{ord(m.group()):04x}", out)
    return f'"{out}"'
