"""One greedy draft-verify loop for every drafter and both cycle paths.

A cycle drafts up to k tokens after the anchor (the last emitted token, at position p),
verifies [anchor, drafts] with the target, keeps the longest matching prefix plus the
target's bonus token, and hands the accepted positions' features to the drafter. What
drafts, per cycle (:class:`Drafting`):

- ``dflash``: the DFlash drafter's block;
- ``ngram``: prompt lookup (:mod:`dflash.ngram`), possibly empty;
- ``hybrid``: the drafter's block, and prompt lookup's draft where the context repeats
  (its last ``min_match`` or more tokens occurred before). On the static path both are
  verified in one target forward and the cycle keeps the branch that accepted more (a
  tie: the drafter's), so it accepts as much as the better of the two
  (:mod:`dflash.decoding.branches`); on the eager path, which has no room for a second
  branch, the lookup's draft replaces the drafter's where there is one. The drafter sees
  every accepted position's features either way.

Where it runs (an :class:`Engine`): :class:`EagerEngine` (dynamic caches, any target,
what :func:`~dflash.decoding.speculative.speculative_greedy` does) or
:class:`StaticEngine` (:mod:`dflash.decoding.static`: fixed shapes, dflash's own Qwen3,
uncaptured on a CPU and in CUDA graphs on a GPU). Every emitted token is the target's
own greedy choice either way, so the output is target-only greedy decoding's
(lossless); ``dflash-eval`` checks it on every prompt.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor

from dflash.decoding import static
from dflash.decoding.branches import TwoBranchVerify
from dflash.decoding.choices import (
    CYCLE_PATHS,
    DEFAULT_LOOKUP_BRANCH,
    DEFAULT_MIN_MATCH,
    LOOKUP_BRANCHES,
)
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


def path_for(requested: str, target: TargetModel) -> str:
    """:func:`choose_path` on ``target``'s device, for what it runs (ValueError where a
    ``static`` cannot run: each caller says whose choice it was)."""
    return choose_path(requested, target.device, static.supports(target))


@dataclass(frozen=True, kw_only=True, slots=True)
class Drafting:
    """What drafts each cycle: ``kind`` dflash | ngram | hybrid. The lookup's n-gram
    orders are ``n_max`` down to ``n_min``; the hybrid's are ``max(n_max, min_match)``
    down to ``min_match``, so a lookup draft there always rests on that long a match."""

    kind: str
    min_match: int = DEFAULT_MIN_MATCH
    n_max: int = DEFAULT_N_MAX
    n_min: int = DEFAULT_N_MIN
    lookup_branch: str = DEFAULT_LOOKUP_BRANCH
    """The hybrid's static cycle: :data:`~dflash.decoding.choices.LOOKUP_BRANCHES`."""

    def __post_init__(self) -> None:
        if self.kind not in ("dflash", "ngram", "hybrid"):
            raise ValueError(f"unknown drafting {self.kind!r}")
        if self.lookup_branch not in LOOKUP_BRANCHES:
            raise ValueError(f"unknown lookup branch {self.lookup_branch!r}")
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
        """Prompt lookup's draft for this cycle, or None for the drafter's alone (the
        hybrid's on the static path: a second branch beside the drafter's)."""
        if lookup is None:
            return None
        drafts = lookup.propose(k)
        if self.kind == "hybrid" and not drafts:
            return None
        return drafts


class Engine(Protocol):
    """A target (and maybe a drafter) with their caches, one prompt at a time."""

    two_branch: bool
    """Whether :meth:`verify_both` runs (the static engine of a hybrid)."""

    def prefill(self, prompt: Sequence[int]) -> int:
        """A fresh prompt into the caches; the greedy token after it."""

    def draft(self, anchor: int, anchor_1: Tensor, at: int) -> Tensor:
        """The drafter's B-1 drafts (device ids) for the block at ``at``."""

    def verify(self, block_1M: Tensor, at: int) -> Tensor:
        """The target's greedy token after each of the M block tokens at ``at`` [M]."""

    def verify_both(self, block_1M: Tensor, lookup: Sequence[int], at: int
                    ) -> tuple[Tensor, Tensor]:
        """The drafter's block and prompt lookup's drafts after the same anchor, in one
        forward: the greedy token after each row of each branch ([M], [L+1])."""

    def accept(self, at: int, n: int, lookup_won: bool = False) -> None:
        """Keep the anchor and n drafts of the last verify (of its lookup branch when
        ``lookup_won``); drop the rest."""


class EagerEngine:
    """Dynamic caches (any target): the same calls as ``speculative_greedy``."""

    two_branch = False

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

    def verify_both(self, block_1M: Tensor, lookup: Sequence[int], at: int
                    ) -> tuple[Tensor, Tensor]:
        raise TypeError("the eager cycle verifies one draft a cycle")

    def accept(self, at: int, n: int, lookup_won: bool = False) -> None:
        self.target.crop_cache(self.cache, at + n + 1)
        if self.drafter is not None:
            self.pending.append(self.feats[:, :n + 1])


class StaticEngine:
    """Fixed shapes (:mod:`dflash.decoding.static`), captured on CUDA. The caches are
    sized for the longest decode seen so far and made (and captured) again only when a
    prompt needs more slots. ``two_branch`` (a hybrid with a drafter): the target's cache
    gets the lookup branch's spare slots and a captured two-branch verify beside the
    one-branch one (:mod:`dflash.decoding.branches`)."""

    def __init__(self, target: TargetModel, drafter: DFlashDrafter | None, max_draft: int,
                 graphs: bool, *, two_branch: bool = False) -> None:
        if two_branch and drafter is None:
            raise ValueError("a two-branch verify needs a drafter's branch")
        self.target, self.drafter = target, drafter
        self.block = max_draft + 1
        self.graphs = graphs
        self.two_branch = two_branch
        self.slots = 0
        self._target: static.StaticTarget | None = None
        self._drafter: static.StaticDrafter | None = None
        self._both: TwoBranchVerify | None = None
        self.feats = torch.empty(0)
        self.last_both = False

    def size_for(self, positions: int) -> None:
        """Caches that hold ``positions`` (prompt + new tokens) and a block past them."""
        slots = static.slots_for(positions + 2 * self.block, self.slots)
        if slots == self.slots:
            return
        self._target = self._drafter = self._both = None  # free the old buffers first
        self.slots = slots
        spare = self.block - 1 if self.two_branch else 0
        self._target = static.StaticTarget(self.target, self.block, slots, self.graphs,
                                           spare=spare)
        if self.two_branch:
            self._both = TwoBranchVerify(self._target, self.graphs)
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
        self.last_both = False
        return truth

    def verify_both(self, block_1M: Tensor, lookup: Sequence[int], at: int
                    ) -> tuple[Tensor, Tensor]:
        if self._both is None:
            raise TypeError("this static engine verifies one draft a cycle")
        mine, theirs, self.feats = self._both.verify(block_1M, lookup, at)
        self.last_both = True
        return mine, theirs

    def accept(self, at: int, n: int, lookup_won: bool = False) -> None:
        if not self.last_both or self._both is None:
            if self._drafter is not None:
                self._drafter.feed(self.feats[:, :n + 1])
            return
        if lookup_won:
            self._both.keep_lookup(at)
        if self._drafter is not None:
            self._drafter.feed(self._both.accepted_rows(self.feats, n, lookup_won))


def matching(drafts: Sequence[int], truth: Sequence[int]) -> int:
    """The drafts accepted: the longest prefix equal to the target's choices."""
    return next((i for i in range(len(drafts)) if drafts[i] != truth[i]), len(drafts))


@dataclass(frozen=True, slots=True)
class Verified:
    """One cycle's verify: the drafts kept, the target's token after the anchor and after
    each of them (and those on the device), whether the drafts kept are prompt lookup's,
    and whether both drafts were verified in one forward."""

    drafts: list[int]
    truth: list[int]
    truth_dev: Tensor
    lookup_won: bool = False
    both: bool = False


def _verify(engine: Engine, drafting: Drafting, picked: list[int] | None, anchor: int,
            anchor_1: Tensor, p: int, k: int) -> Verified:
    """One cycle's drafts and verify. Where both drafted, the drafts and the target's
    choices come back in one wait for the device; with ``lookup_branch="useful"`` a
    second wait first reads the drafter's drafts, and a lookup draft that is their own
    start is not verified: its branch would accept no more than theirs (the same tokens
    after the same text), and a tie keeps the drafter's."""
    if picked is not None and not (drafting.kind == "hybrid" and engine.two_branch):
        truth = engine.verify(torch.tensor([[anchor, *picked]], device=anchor_1.device), p)
        return Verified(picked, truth.tolist(), truth, lookup_won=drafting.kind == "hybrid")
    drafts_k = engine.draft(anchor, anchor_1, p)[:k]
    block_1M = torch.cat([anchor_1, drafts_k])[None]
    if (picked is not None and drafting.lookup_branch == "useful"
            and drafts_k[:len(picked)].tolist() == picked):
        picked = None
    if picked is None:
        truth = engine.verify(block_1M, p)
        both = torch.cat([drafts_k, truth]).tolist()
        return Verified(both[:k], both[k:], truth)
    truth_a, truth_b = engine.verify_both(block_1M, picked, p)
    both = torch.cat([drafts_k, truth_a, truth_b]).tolist()
    mine, truth_mine, truth_theirs = both[:k], both[k:2 * k + 1], both[2 * k + 1:]
    if matching(picked, truth_theirs) > matching(mine, truth_mine):  # a tie: the drafter's
        return Verified(picked, truth_theirs, truth_b, lookup_won=True, both=True)
    return Verified(mine, truth_mine, truth_a, both=True)


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
    lookups = both = 0
    while len(tokens) < max_new_tokens and not hit_stop(tokens, stop_ids):
        p = len(prompt) + len(tokens) - 1
        k = min(max_draft, max_new_tokens - len(tokens) - 1)
        v = _verify(engine, drafting, drafting.pick(lookup, k), tokens[-1], anchor_1, p, k)
        lookups += v.lookup_won
        both += v.both
        drafts, truth = v.drafts, v.truth_dev
        n = matching(drafts, v.truth)
        emitted = [*drafts[:n], v.truth[n]]
        tokens.extend(emitted)
        if lookup is not None:
            lookup.extend(emitted)
        # A view of the verify's output: read (copied into the next block or the
        # drafter's anchor) before the next verify overwrites it.
        anchor_1 = truth[n:n + 1]
        accepted.append(n + 1)
        drafted.append(len(drafts))
        engine.accept(p, n, v.lookup_won)
    sync_device(device)
    return DecodeResult(finish(tokens, max_new_tokens, stop_ids), len(accepted),
                        time.perf_counter() - t0, tuple(accepted), tuple(drafted), lookups,
                        both)


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
    chosen = path_for(path, target)
    model = drafter if drafting.kind != "ngram" else None
    engine: EagerEngine | StaticEngine
    if chosen == "static":
        engine = StaticEngine(target, model, cap, static.graphs_for(target.device),
                              two_branch=drafting.kind == "hybrid")
    else:
        engine = EagerEngine(target, model)

    def decode(prompt: Sequence[int], *, max_new_tokens: int,
               stop_ids: Sequence[int] = ()) -> DecodeResult:
        if isinstance(engine, StaticEngine):
            engine.size_for(len(prompt) + max_new_tokens)
        return run_cycles(engine, drafting, prompt, device=target.device,
                          max_new_tokens=max_new_tokens, max_draft=cap, stop_ids=stop_ids)
    return decode
