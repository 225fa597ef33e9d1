"""Human-readable quantities, shared by the explanations and the renderers."""

from __future__ import annotations


def human_bytes(n: int | None) -> str:
    """``353.0 MB``; decimal units, as du --si and file managers show them."""
    if n is None:
        return "?"
    value = float(n)
    for unit in ("B", "KB", "MB", "GB"):
        if value < 1000:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    return f"{value:.1f} TB"
