"""One greedy draft-verify loop for every drafter and both cycle paths.

A cycle drafts up to k tokens after the anchor (the last emitted token, at position p),
verifies [anchor, drafts] with the target, keeps the longest matching prefix plus the
target's bonus token, and hands the accepted positions' features to the drafter. What
drafts, per cycle (:class:`Drafting`):

- ``dflash``: the DFlash drafter's block;
- ``ngram``: prompt lookup (:mod:`dflash.ngram`), possibly empty;
- ``hybrid``: prompt lookup's draft where the context repeats (its last ``min_match`` or
  more tokens occurred before), otherwise the drafter's. The drafter still sees every
  accepted position's features, so a lookup cycle costs it nothing but a staged copy.

Where it runs (an :class:`Engine`): :class:`EagerEngine` (dynamic caches, any target,
what :func:`~dflash.decoding.speculative.speculative_greedy` does) or
:class:`StaticEngine` (:mod:`dflash.decoding.static`: fixed shapes, CUDA graphs on a
GPU). Every emitted token is the target's own greedy choice either way, so the output is
target-only greedy decoding's (lossless); ``dflash-eval`` checks it on every prompt.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor

from dflash.decoding import static
from dflash.decoding.choices import CYCLE_PATHS, DEFAULT_MIN_MATCH
from dflash.decoding.speculative import (
    Decoder,
    DecodeResult,
    DraftStream,
    check_max_draft,
    finish,
    hit_stop,
)
from dflash.meter import sync_device
from dflash.model import DFlashDrafter
from dflash.ngram import DEFAULT_N_MAX, DEFAULT_N_MIN, NgramDrafter
from dflash.target import TargetCache, TargetModel


def choose_path(requested: str, device: torch.device, supported: bool) -> str:
    """``auto``: the static cycle where it pays, a CUDA device and a target it runs
    (dflash's own Qwen3); else eager. ``static`` on a target it cannot run is refused."""
    if requested not in CYCLE_PATHS:
        raise ValueError(f"cycle path must be one of {', '.join(CYCLE_PATHS)}, "
                         f"got {requested!r}")
    if requested == "static" and not supported:
        raise ValueError("the static cycle runs dflash's own Qwen3 targets only")
    if requested == "auto":
        return "static" if supported and static.graphs_for(device) else "eager"
    return requested


@dataclass(frozen=True, kw_only=True, slots=True)
class Drafting:
    """What drafts each cycle: ``kind`` dflash | ngram | hybrid. The lookup's n-gram
    orders are ``n_max`` down to ``n_min``; the hybrid's are ``max(n_max, min_match)``
    down to ``min_match``, so a lookup draft there always rests on that long a match."""

    kind: str
    min_match: int = DEFAULT_MIN_MATCH
    n_max: int = DEFAULT_N_MAX
    n_min: int = DEFAULT_N_MIN

    def __post_init__(self) -> None:
        if self.kind not in ("dflash", "ngram", "hybrid"):
            raise ValueError(f"unknown drafting {self.kind!r}")
        if self.min_match < 1:
            raise ValueError(f"min_match must be >= 1, got {self.min_match}")

    def lookup(self, context: Sequence[int]) -> NgramDrafter | None:
        if self.kind == "dflash":
            return None
        if self.kind == "hybrid":
            return NgramDrafter(n_max=max(self.n_max, self.min_match), n_min=self.min_match,
                                context=context)
        return NgramDrafter(n_max=self.n_max, n_min=self.n_min, context=context)

    def pick(self, lookup: NgramDrafter | None, k: int) -> list[int] | None:
        """Prompt lookup's draft for this cycle, or None for the drafter's."""
        if lookup is None:
            return None
        drafts = lookup.propose(k)
        if self.kind == "hybrid" and not drafts:
            return None
        return drafts


class Engine(Protocol):
    """A target (and maybe a drafter) with their caches, one prompt at a time."""

    def prefill(self, prompt: Sequence[int]) -> int:
        """A fresh prompt into the caches; the greedy token after it."""

    def draft(self, anchor: int, anchor_1: Tensor, at: int) -> Tensor:
        """The drafter's B-1 drafts (device ids) for the block at ``at``."""

    def verify(self, block_1M: Tensor, at: int) -> Tensor:
        """The target's greedy token after each of the M block tokens at ``at`` [M]."""

    def accept(self, at: int, n: int) -> None:
        """Keep the anchor and n drafts of the last verify; drop the rest."""


class EagerEngine:
    """Dynamic caches (any target): the same calls as ``speculative_greedy``."""

    def __init__(self, target: TargetModel, drafter: DFlashDrafter | None) -> None:
        self.target, self.drafter = target, drafter
        self.cache: TargetCache = target.new_cache()
        self.stream = None if drafter is None else DraftStream(drafter, target)
        self.pending: list[Tensor] = []
        self.feats = torch.empty(0)

    def prefill(self, prompt: Sequence[int]) -> int:
        self.cache = self.target.new_cache()
        ids = torch.tensor([list(prompt)], device=self.target.device)
        logits, feats = self.target.forward_cached(ids, self.cache, 0)
        self.pending = [feats]
        if self.drafter is not None:
            self.stream = DraftStream(self.drafter, self.target)
        return int(logits[0, -1].argmax())

    def draft(self, anchor: int, anchor_1: Tensor, at: int) -> Tensor:
        if self.stream is None:
            raise ValueError("no drafter to draft with")
        new = self.pending[0] if len(self.pending) == 1 else torch.cat(self.pending, dim=1)
        self.pending = []
        return self.stream.draft(anchor, at, new)[1:].argmax(dim=-1)

    def verify(self, block_1M: Tensor, at: int) -> Tensor:
        logits, self.feats = self.target.forward_cached(block_1M, self.cache, at)
        return logits[0].argmax(dim=-1)

    def accept(self, at: int, n: int) -> None:
        self.target.crop_cache(self.cache, at + n + 1)
        if self.drafter is not None:
            self.pending.append(self.feats[:, :n + 1])


class StaticEngine:
    """Fixed shapes (:mod:`dflash.decoding.static`), captured on CUDA. The caches are
    sized for the longest decode seen so far and made (and captured) again only when a
    prompt needs more slots."""

    def __init__(self, target: TargetModel, drafter: DFlashDrafter | None, max_draft: int,
                 graphs: bool) -> None:
        self.target, self.drafter = target, drafter
        self.block = max_draft + 1
        self.graphs = graphs
        self.slots = 0
        self._target: static.StaticTarget | None = None
        self._drafter: static.StaticDrafter | None = None
        self.feats = torch.empty(0)

    def size_for(self, positions: int) -> None:
        """Caches that hold ``positions`` (prompt + new tokens) and a block past them."""
        slots = static.slots_for(positions + 2 * self.block, self.slots)
        if slots == self.slots:
            return
        self._target = self._drafter = None  # free the old buffers (and graphs) first
        self.slots = slots
        self._target = static.StaticTarget(self.target, self.block, slots, self.graphs)
        if self.drafter is not None:
            rows = 2 * self.drafter.cfg.block_size
            self._drafter = static.StaticDrafter(self.drafter, self.target, rows, slots,
                                                 self.graphs)

    def _verifier(self) -> static.StaticTarget:
        if self._target is None:
            raise RuntimeError("size the static engine (size_for) before decoding")
        return self._target

    def prefill(self, prompt: Sequence[int]) -> int:
        first, feats = self._verifier().prefill(prompt)
        if self._drafter is not None:
            self._drafter.reset()
            self._drafter.feed(feats)
        return first

    def draft(self, anchor: int, anchor_1: Tensor, at: int) -> Tensor:
        if self._drafter is None:
            raise ValueError("no drafter to draft with")
        return self._drafter.draft(anchor_1, at)

    def verify(self, block_1M: Tensor, at: int) -> Tensor:
        truth, self.feats = self._verifier().verify(block_1M, at)
        return truth

    def accept(self, at: int, n: int) -> None:
        if self._drafter is not None:
            self._drafter.feed(self.feats[:, :n + 1])


@torch.no_grad()
def run_cycles(engine: Engine, drafting: Drafting, prompt: Sequence[int], *, device: torch.device,
               max_new_tokens: int, max_draft: int, stop_ids: Sequence[int] = ()
               ) -> DecodeResult:
    """Greedy speculative decoding of ``prompt``: at most ``max_draft`` drafts a cycle,
    never more than the tokens still to generate."""
    if not prompt:
        raise ValueError("the prompt is empty")
    sync_device(device)
    t0 = time.perf_counter()
    first = engine.prefill(prompt)
    tokens = [first]
    lookup = drafting.lookup([*prompt, first])
    anchor_1 = torch.tensor([first], device=device)
    accepted: list[int] = []
    drafted: list[int] = []
    lookups = 0
    while len(tokens) < max_new_tokens and not hit_stop(tokens, stop_ids):
        p = len(prompt) + len(tokens) - 1
        k = min(max_draft, max_new_tokens - len(tokens) - 1)
        picked = drafting.pick(lookup, k)
        if picked is None:
            drafts_k = engine.draft(tokens[-1], anchor_1, p)[:k]
            truth = engine.verify(torch.cat([anchor_1, drafts_k])[None], p)
            # One wait for the device a cycle: drafts and the target's choices together.
            both = torch.cat([drafts_k, truth]).tolist()
            drafts, truth_ids = both[:k], both[k:]
        else:
            lookups += drafting.kind == "hybrid"
            drafts = picked
            truth = engine.verify(torch.tensor([[tokens[-1], *drafts]], device=device), p)
            truth_ids = truth.tolist()
        n = next((i for i in range(len(drafts)) if drafts[i] != truth_ids[i]), len(drafts))
        emitted = [*drafts[:n], truth_ids[n]]
        tokens.extend(emitted)
        if lookup is not None:
            lookup.extend(emitted)
        # A view of the verify's output: read (copied into the next block or the
        # drafter's anchor) before the next verify overwrites it.
        anchor_1 = truth[n:n + 1]
        accepted.append(n + 1)
        drafted.append(len(drafts))
        engine.accept(p, n)
    sync_device(device)
    return DecodeResult(finish(tokens, max_new_tokens, stop_ids), len(accepted),
                        time.perf_counter() - t0, tuple(accepted), tuple(drafted), lookups)


def cycle_decoder(target: TargetModel, drafter: DFlashDrafter | None, drafting: Drafting, *,
                  max_draft: int | None = None, path: str = "auto") -> Decoder:
    """A :class:`~dflash.decoding.speculative.Decoder` for ``drafting`` on the cycle path
    ``path`` (:func:`choose_path`). ``max_draft`` defaults to the drafter's B-1 (15 with
    no drafter)."""
    if drafting.kind != "ngram" and drafter is None:
        raise ValueError(f"{drafting.kind} drafting needs a drafter")
    block = drafter.cfg.block_size if drafter is not None else 16
    cap = check_max_draft(max_draft, block) if drafter is not None else (
        15 if max_draft is None else max_draft)
    if cap < 0:
        raise ValueError(f"max_draft must be >= 0, got {cap}")
    chosen = choose_path(path, target.device, static.supports(target))
    model = drafter if drafting.kind != "ngram" else None
    engine: EagerEngine | StaticEngine
    if chosen == "static":
        engine = StaticEngine(target, model, cap, static.graphs_for(target.device))
    else:
        engine = EagerEngine(target, model)

    def decode(prompt: Sequence[int], *, max_new_tokens: int,
               stop_ids: Sequence[int] = ()) -> DecodeResult:
        if isinstance(engine, StaticEngine):
            engine.size_for(len(prompt) + max_new_tokens)
        return run_cycles(engine, drafting, prompt, device=target.device,
                          max_new_tokens=max_new_tokens, max_draft=cap, stop_ids=stop_ids)
    return decode
