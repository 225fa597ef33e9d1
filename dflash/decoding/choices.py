"""The decoding choices a command checks before torch is imported (plain Python)."""

from __future__ import annotations

CYCLE_PATHS = ("auto", "eager", "static")
"""How a draft-verify cycle runs: ``static`` (fixed shapes, CUDA graphs on a GPU:
:mod:`dflash.decoding.static`), ``eager`` (dynamic caches), ``auto`` (static on a GPU
where the target allows it)."""

HYBRID_PREFIX = "hybrid:"
"""``--drafter hybrid:DIR``: DIR's drafter, and prompt lookup where the context repeats
(the static cycle verifies both at once and keeps the better; the eager one the lookup's)."""

DEFAULT_MIN_MATCH = 3
"""The hybrid has a prompt-lookup draft when at least this many tokens matched."""

LOOKUP_BRANCHES = ("always", "useful")
"""When the hybrid's static cycle verifies prompt lookup's draft beside the drafter's:
``always`` (the default, :data:`DEFAULT_LOOKUP_BRANCH`) wherever the lookup has a draft;
``useful`` where that draft is not the start of the drafter's own (such a draft can at
best tie, and a tie keeps the drafter's; knowing it waits for the drafts once a cycle,
which on an H100 cost more than the skipped rows saved: docs/BENCHMARKS.md, issue 36,
tenth run)."""
DEFAULT_LOOKUP_BRANCH = "always"
