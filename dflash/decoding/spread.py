"""How sure a τ is: its spread over the prompts it was measured on (torch-free).

A τ over a dozen prompts moves with the prompts drawn: on the twelfth real-target run
one prompt of twelve decoded at τ 1.7 where the others gave 8-14, and took the pooled τ
from 11 to 7.9 (docs/BENCHMARKS.md, issue 36). :func:`tau_interval` says how far: a
percentile bootstrap over prompts (the prompts redrawn with replacement, each draw's τ
pooled as the point is), reported beside the point by ``dflash-eval``
(:mod:`dflash.decoding.evaluate`) and the trainer's free-running held-out τ
(:mod:`dflash.heldout`), so two τ are compared with their spread in sight.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

INTERVAL_LEVEL = 0.95
INTERVAL_DRAWS = 2000


def pooled_tau(prompts: Sequence[tuple[int, int]]) -> float:
    """Tokens per cycle with every prompt's cycles pooled (``prompts``: each one's
    accepted tokens and cycles); 0.0 without a cycle."""
    cycles = sum(c for _, c in prompts)
    return sum(a for a, _ in prompts) / cycles if cycles else 0.0


def tau_interval(prompts: Sequence[tuple[int, int]], *, level: float = INTERVAL_LEVEL,
                 draws: int = INTERVAL_DRAWS, seed: int = 0) -> tuple[float, float]:
    """The ``level`` percentile bootstrap interval of :func:`pooled_tau` over prompts:
    ``draws`` redraws of as many prompts with replacement, each pooled. The same input
    gives the same interval (``seed``); one prompt or none gives the point itself."""
    point = pooled_tau(prompts)
    if len(prompts) < 2:
        return point, point
    rng = random.Random(seed)  # noqa: S311 (resampling prompts, not a secret)
    n = len(prompts)
    taus = sorted(pooled_tau([prompts[rng.randrange(n)] for _ in range(n)])
                  for _ in range(draws))
    tail = (1.0 - level) / 2
    return taus[int(tail * (draws - 1))], taus[round((1.0 - tail) * (draws - 1))]
