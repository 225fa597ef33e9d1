"""Delta debugging (ddmin): a minimal set of changes that still makes the command fail.

Plain halving assumes one culprit; ddmin also finds changes that fail only together (a
package and the upgrade of its dependency). A configuration is a set of change indices
applied to GOOD; ``test`` answers ``pass``, ``fail`` or ``skip`` (could not be built or
judged: unknown, as in ``git bisect skip``). GOOD (nothing applied) passes and BAD
(everything applied) fails: the caller checked both before the search.

Candidates are tested in batches of ``jobs`` (parallel trials); in each round the first
failing candidate, in ddmin's order, is taken, so the result does not depend on ``jobs``.
Pure: no I/O; ``test`` does the work.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from envguard.frozen import frozen

PASS, FAIL, SKIP = "pass", "fail", "skip"
OUTCOMES = (PASS, FAIL, SKIP)

Config = frozenset[int]
Tester = Callable[[Sequence[Config]], Sequence[str]]


@frozen
class SearchResult:
    culprits: Config
    """A failing set from which no single change can be removed (as far as tested)."""
    unproven: tuple[int, ...]
    """Changes of ``culprits`` whose removal could not be tested (its trial was skipped):
    the set may not be minimal."""


def split(items: Sequence[int], parts: int) -> list[list[int]]:
    """``items`` in ``parts`` contiguous, nearly equal chunks (the larger ones first)."""
    size, extra = divmod(len(items), parts)
    out: list[list[int]] = []
    start = 0
    for i in range(parts):
        end = start + size + (1 if i < extra else 0)
        out.append(list(items[start:end]))
        start = end
    return [chunk for chunk in out if chunk]


def _first_failing(candidates: Sequence[Config], test: Tester, jobs: int) -> int | None:
    for start in range(0, len(candidates), max(1, jobs)):
        batch = candidates[start:start + max(1, jobs)]
        for offset, outcome in enumerate(test(batch)):
            if outcome == FAIL:
                return start + offset
    return None


def ddmin(count: int, test: Tester, *, jobs: int = 1) -> SearchResult:
    """Minimise the failing set ``{0, …, count-1}`` (Zeller and Hildebrandt's ddmin)."""
    current = list(range(count))
    granularity = 2
    while len(current) >= 2:
        chunks = split(current, min(granularity, len(current)))
        subsets = [frozenset(c) for c in chunks]
        complements = [frozenset(current) - s for s in subsets] if len(chunks) > 2 else []
        found = _first_failing(subsets, test, jobs)
        if found is not None:
            current, granularity = sorted(subsets[found]), 2
            continue
        found = _first_failing(complements, test, jobs)
        if found is not None:
            current, granularity = sorted(complements[found]), max(len(chunks) - 1, 2)
            continue
        if len(chunks) >= len(current):
            break
        granularity = min(len(current), 2 * len(chunks))
    return SearchResult(culprits=frozenset(current), unproven=_unproven(current, test))


def _unproven(current: list[int], test: Tester) -> tuple[int, ...]:
    """Changes whose removal from ``current`` was not seen to pass (a cached answer)."""
    if len(current) < 2:
        return ()
    without = [frozenset(current) - {i} for i in current]
    outcomes = test(without)
    return tuple(i for i, outcome in zip(current, outcomes, strict=True) if outcome != PASS)
