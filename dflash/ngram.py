"""Prompt-lookup (n-gram) drafting: a drafter with no model, the baseline DFlash must beat.

To draft after a context, take its last n tokens, find their most recent earlier
occurrence in the context, and propose the (up to) k tokens that followed it; try n from
``n_max`` down to ``n_min`` and stop at the first n that matches. This is prompt lookup
decoding, the method vLLM ships as its ``ngram`` speculative method. It pays on text that
repeats its own context (code that reuses names, edits, quotes) and costs one short
verify block when it misses.

Three layers, the first two torch-free:

- :func:`propose`: the definition, a stateless backward scan;
- :class:`NgramDrafter`: the same answers from an index updated as tokens are accepted
  (each n-gram's most recent end), for decode loops over long contexts;
- :func:`speculate`: the greedy draft-verify loop against any :class:`Verifier` (the
  target's side: prefill, verify a block, crop the cache), lossless by construction;
  :class:`TargetVerifier` adapts the frozen target of ``dflash.target`` to it, and
  :class:`ReplayVerifier` replays a recorded greedy decode (exact n-gram tau of recorded
  target outputs, such as ``dflash-generate`` rows, with no model at all).

The loop is the one of ``speculative_greedy`` with the drafter swapped: the anchor (the
last emitted token) plus the drafts are verified at positions p..p+m, the longest
matching prefix is kept plus the target's bonus token, and the target cache is cropped to
p+n+1. A draft may be shorter than ``max_draft`` (the match is near the end of the
context) or empty (no match): the block is then just the anchor, a plain greedy step.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

DEFAULT_N_MAX = 4
DEFAULT_N_MIN = 1


def _check_orders(n_max: int, n_min: int) -> None:
    if n_min < 1:
        raise ValueError(f"n_min must be >= 1, got {n_min}")
    if n_max < n_min:
        raise ValueError(f"n_max must be >= n_min, got n_max={n_max}, n_min={n_min}")


def _check_k(k: int) -> None:
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")


def propose(context: Sequence[int], k: int, *, n_max: int = DEFAULT_N_MAX,
            n_min: int = DEFAULT_N_MIN) -> list[int]:
    """Up to ``k`` tokens that followed the most recent earlier occurrence of the
    context's last n tokens, for the largest n in [n_min, n_max] that occurs earlier.

    "Earlier" means the occurrence ends before the last token, so at least one token
    follows it; the proposal stops at the end of the context, so it can be shorter than k.
    Empty when nothing matches, the context is too short, or k is 0.
    """
    _check_orders(n_max, n_min)
    _check_k(k)
    ctx = list(context)
    length = len(ctx)
    if k == 0:
        return []
    for n in range(min(n_max, length - 1), n_min - 1, -1):
        suffix = ctx[length - n:]
        last = suffix[-1]
        for start in range(length - n - 1, -1, -1):  # most recent first
            if ctx[start + n - 1] == last and ctx[start:start + n] == suffix:
                return ctx[start + n:start + n + k]
    return []


class NgramDrafter:
    """:func:`propose` over a growing context, with an index instead of a scan.

    For every order n it maps each n-gram to the end of its most recent occurrence that
    has a following token, so a proposal costs O(n_max) lookups whatever the length.
    """

    def __init__(self, *, n_max: int = DEFAULT_N_MAX, n_min: int = DEFAULT_N_MIN,
                 context: Iterable[int] = ()) -> None:
        _check_orders(n_max, n_min)
        self.n_max, self.n_min = n_max, n_min
        self._tokens: list[int] = []
        self._last_end: dict[int, dict[tuple[int, ...], int]] = {
            n: {} for n in range(n_min, n_max + 1)}
        self.extend(context)

    def __len__(self) -> int:
        return len(self._tokens)

    @property
    def tokens(self) -> tuple[int, ...]:
        return tuple(self._tokens)

    def append(self, token: int) -> None:
        """Add one token; the n-grams that end just before it now have a follower."""
        end = len(self._tokens)
        for n, index in self._last_end.items():
            if end >= n:
                index[tuple(self._tokens[end - n:end])] = end
        self._tokens.append(token)

    def extend(self, tokens: Iterable[int]) -> None:
        for token in tokens:
            self.append(token)

    def propose(self, k: int) -> list[int]:
        """Exactly ``propose(self.tokens, k, n_max=..., n_min=...)``."""
        _check_k(k)
        if k == 0:
            return []
        length = len(self._tokens)
        for n in range(min(self.n_max, length - 1), self.n_min - 1, -1):
            end = self._last_end[n].get(tuple(self._tokens[length - n:]))
            if end is not None:
                return self._tokens[end:end + k]
        return []


@dataclass(frozen=True, slots=True)
class NgramSpec:
    """The n-gram orders of a ``--drafter ngram[:N_MAX[:N_MIN]]`` argument."""

    n_max: int = DEFAULT_N_MAX
    n_min: int = DEFAULT_N_MIN

    def __post_init__(self) -> None:
        _check_orders(self.n_max, self.n_min)

    @classmethod
    def parse(cls, text: str) -> NgramSpec | None:
        """``ngram`` -> the defaults, ``ngram:5`` -> n_max 5, ``ngram:5:2`` -> n_min 2 too;
        None for anything else (a drafter folder). ValueError for a malformed spec."""
        name, sep, rest = text.partition(":")
        if name != "ngram":
            return None
        parts = rest.split(":") if sep else []
        if len(parts) > 2 or not all(p.isdigit() for p in parts):
            raise ValueError(f"bad n-gram drafter {text!r}: expected ngram[:N_MAX[:N_MIN]]")
        n_max = int(parts[0]) if parts else DEFAULT_N_MAX
        n_min = int(parts[1]) if len(parts) > 1 else min(DEFAULT_N_MIN, n_max)
        return cls(n_max, n_min)


class Verifier(Protocol):
    """The target's side of a greedy draft-verify loop, on one KV cache."""

    def prefill(self, prompt: Sequence[int]) -> int:
        """Run the prompt into a fresh cache; return the greedy token after it."""

    def verify(self, block: Sequence[int], start: int) -> list[int]:
        """Run ``block`` at positions start.. on the cache (which holds exactly ``start``
        positions); return the greedy token after each block position."""

    def keep(self, length: int) -> None:
        """Crop the cache to its first ``length`` positions."""


@dataclass(frozen=True, slots=True)
class Decoded:
    tokens: tuple[int, ...]
    """The generated tokens, cut at max_new_tokens or after the first stop id."""
    accepted: tuple[int, ...]
    """Per verify cycle: tokens emitted (accepted drafts + the bonus token)."""
    drafted: tuple[int, ...]
    """Per verify cycle: tokens the drafter proposed."""

    @property
    def target_forwards(self) -> int:
        """Target passes after the prefill: one per cycle."""
        return len(self.accepted)

    @property
    def tau(self) -> float:
        return sum(self.accepted) / len(self.accepted) if self.accepted else 0.0


def _finish(tokens: Sequence[int], max_new_tokens: int, stops: frozenset[int]
            ) -> tuple[int, ...]:
    kept = list(tokens[:max_new_tokens])
    for i, token in enumerate(kept):
        if token in stops:
            return tuple(kept[:i + 1])
    return tuple(kept)


def _matching(drafts: Sequence[int], truth: Sequence[int]) -> int:
    n = 0
    while n < len(drafts) and drafts[n] == truth[n]:
        n += 1
    return n


def speculate(verifier: Verifier, prompt: Sequence[int], *, max_new_tokens: int,
              max_draft: int, stop_ids: Iterable[int] = (), n_max: int = DEFAULT_N_MAX,
              n_min: int = DEFAULT_N_MIN) -> Decoded:
    """Greedy speculative decoding with n-gram drafts of at most ``max_draft`` tokens
    (the DFlash drafter's block size minus one, to compare like with like).

    Every emitted token is the verifier's own greedy choice, so the tokens equal plain
    greedy decoding of the same verifier. Drafts never run past ``max_new_tokens``.
    """
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    _check_k(max_draft)
    if not prompt:
        raise ValueError("the prompt is empty")
    stops = frozenset(stop_ids)
    tokens = [verifier.prefill(prompt)]
    drafter = NgramDrafter(n_max=n_max, n_min=n_min, context=[*prompt, tokens[0]])
    accepted: list[int] = []
    drafted: list[int] = []
    done = tokens[0] in stops
    while len(tokens) < max_new_tokens and not done:
        anchor_pos = len(prompt) + len(tokens) - 1
        drafts = drafter.propose(min(max_draft, max_new_tokens - len(tokens) - 1))
        truth = verifier.verify([tokens[-1], *drafts], anchor_pos)
        if len(truth) != len(drafts) + 1:
            raise ValueError(f"the verifier returned {len(truth)} tokens for a block of "
                             f"{len(drafts) + 1}")
        n = _matching(drafts, truth)
        emitted = [*drafts[:n], truth[n]]
        tokens.extend(emitted)
        drafter.extend(emitted)
        accepted.append(n + 1)
        drafted.append(len(drafts))
        verifier.keep(anchor_pos + n + 1)
        done = any(t in stops for t in emitted)
    return Decoded(_finish(tokens, max_new_tokens, stops), tuple(accepted), tuple(drafted))


class TargetVerifier:
    """:class:`Verifier` over the frozen target of ``dflash.target`` (what it uses:
    ``new_cache``, ``forward_cached``, ``crop_cache`` and ``device``); torch is imported
    on first use."""

    def __init__(self, target: Any) -> None:
        self.target = target
        self.cache: Any = None

    def _greedy(self, ids: Sequence[int], start: int) -> list[int]:
        import torch

        with torch.no_grad():
            ids_1T = torch.tensor([list(ids)], dtype=torch.long, device=self.target.device)
            logits_1TV, _ = self.target.forward_cached(ids_1T, self.cache, start)
            out: list[int] = logits_1TV[0].argmax(dim=-1).tolist()
        return out

    def prefill(self, prompt: Sequence[int]) -> int:
        self.cache = self.target.new_cache()
        return self._greedy(prompt, 0)[-1]

    def verify(self, block: Sequence[int], start: int) -> list[int]:
        return self._greedy(block, start)

    def keep(self, length: int) -> None:
        self.target.crop_cache(self.cache, length)


class ReplayVerifier:
    """:class:`Verifier` of a recorded greedy decode: ``sequence`` is a prompt followed by
    the target's greedy continuation. Decoding that prompt with ``max_new_tokens`` = the
    continuation's length gives exactly the cycles the live target would give."""

    def __init__(self, sequence: Sequence[int]) -> None:
        self.sequence = list(sequence)
        self.length = 0

    def _after(self, position: int) -> int:
        if position + 1 >= len(self.sequence):
            raise ValueError(f"the recorded decode ends at position {len(self.sequence) - 1}; "
                             f"asked for the token after {position}")
        return self.sequence[position + 1]

    def prefill(self, prompt: Sequence[int]) -> int:
        if list(prompt) != self.sequence[:len(prompt)]:
            raise ValueError("the prompt is not the start of the recorded decode")
        self.length = len(prompt)
        return self._after(len(prompt) - 1)

    def verify(self, block: Sequence[int], start: int) -> list[int]:
        if start != self.length:
            raise ValueError(f"the cache holds {self.length} positions, not {start}")
        self.length = start + len(block)
        return [self._after(start + i) for i in range(len(block))]

    def keep(self, length: int) -> None:
        self.length = min(self.length, length)
