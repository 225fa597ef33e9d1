"""The decoding choices a command checks before torch is imported (plain Python)."""

from __future__ import annotations

CYCLE_PATHS = ("auto", "eager", "static")
"""How a draft-verify cycle runs: ``static`` (fixed shapes, CUDA graphs on a GPU:
:mod:`dflash.decoding.static`), ``eager`` (dynamic caches), ``auto`` (static on a GPU
where the target allows it)."""

HYBRID_PREFIX = "hybrid:"
"""``--drafter hybrid:DIR``: prompt lookup where the context repeats, else DIR's drafter."""

DEFAULT_MIN_MATCH = 3
"""The hybrid takes prompt lookup's draft when at least this many tokens matched."""
