"""Speculative decoding with a DFlash drafter: draft a block, verify it with the target,
keep the longest matching prefix plus the target's bonus token, crop both caches.

One cycle, with p the position of the anchor (the last accepted token, which has no
target hidden state yet):
1. the drafter sees the target features of positions [its cache length, p) plus the block
   [anchor, MASK*(B-1)] at positions p..p+B-1, attends with no mask (its cache holds
   exactly the context before the anchor; the block is bidirectional), and its cache is
   then cropped back to p: context kept, block dropped;
2. the target runs the anchor and the B-1 drafted tokens at p..p+B-1 on its cache; its
   argmax at slot k is the token that follows slot k;
3. accept drafts d_1..d_n while d_k equals the target's argmax at slot k-1, then append
   the target's argmax at slot n (the bonus token); crop the target cache to p+n+1;
   the features of positions p..p+n become the drafter's next new context.

Every emitted token is the target's own greedy choice, so the output equals target-only
greedy decoding token for token (lossless); tau is the mean number of tokens per cycle.
Batch size 1, as in the published DFlash inference code.

:func:`ngram_greedy` is the same loop with the prompt-lookup drafter of :mod:`dflash.ngram`
(the baseline with no model). :func:`dflash.decoding.evaluate.evaluate` takes any such
decoder: it times the target-only reference and the speculative decoder on the same
prompts and compares their tokens.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor

from dflash.masks import sdpa_attend
from dflash.meter import sync_device
from dflash.model import DFlashDrafter
from dflash.ngram import DEFAULT_N_MAX, DEFAULT_N_MIN, TargetVerifier, speculate
from dflash.target import TargetCache, TargetModel


@dataclass(frozen=True, slots=True)
class DecodeResult:
    tokens: tuple[int, ...]
    """The generated tokens (after the prompt), cut at max_new_tokens or a stop id."""
    target_forwards: int
    """Target forward passes after the prefill (one per token, or one per cycle)."""
    seconds: float
    accepted: tuple[int, ...] = ()
    """Speculative only: tokens emitted per cycle (accepted drafts + 1)."""
    drafted: tuple[int, ...] = ()
    """Speculative only: draft tokens verified per cycle (at most max_draft; fewer near
    max_new_tokens, and for the n-gram drafter when its match is short or missing); of a
    hybrid's two-branch cycle, the kept branch's."""
    lookups: int = 0
    """Hybrid only: cycles that kept prompt lookup's draft (the static cycle: where its
    branch accepted more than the drafter's; the eager one: wherever it had one)."""
    both_verified: int = 0
    """Hybrid, static cycle: cycles that verified both drafts in one forward."""


class DraftStream:
    """The drafter's side of decoding: its KV cache and one block per call."""

    def __init__(self, drafter: DFlashDrafter, target: TargetModel) -> None:
        self.drafter = drafter
        self.target = target
        self.cache = drafter.new_cache()
        self.block_size = drafter.cfg.block_size
        self.mask_token_id = drafter.cfg.mask_token_id

    @torch.no_grad()
    def draft(self, anchor_id: int, anchor_pos: int, new_feats_1TF: Tensor) -> Tensor:
        """fp32 logits [B, V] for the block at ``anchor_pos``; ``new_feats_1TF`` are the
        target features of positions cache.length .. anchor_pos-1."""
        start = self.cache.length
        if start + new_feats_1TF.shape[1] != anchor_pos:
            raise ValueError(f"draft cache holds {start} positions and "
                             f"{new_feats_1TF.shape[1]} new ones, but the anchor is at "
                             f"{anchor_pos}")
        device = new_feats_1TF.device
        ids_1B = torch.full((1, self.block_size), self.mask_token_id, device=device)
        ids_1B[0, 0] = anchor_id
        dtype = next(self.drafter.parameters()).dtype
        emb_1BD = self.target.embed(ids_1B).to(dtype)
        pos_block_1B = torch.arange(anchor_pos, anchor_pos + self.block_size, device=device)[None]
        pos_ctx_1T = torch.arange(start, anchor_pos, device=device)[None]
        hidden_1BD = self.drafter(emb_1BD, new_feats_1TF.to(dtype), pos_block_1B, pos_ctx_1T,
                                  sdpa_attend(None), self.cache)
        self.cache.crop(anchor_pos)
        logits: Tensor = self.target.lm_head(hidden_1BD[0]).float()
        return logits


def finish(tokens: list[int], max_new_tokens: int, stop_ids: Sequence[int]) -> tuple[int, ...]:
    tokens = tokens[:max_new_tokens]
    for i, tok in enumerate(tokens):
        if tok in stop_ids:
            return tuple(tokens[: i + 1])
    return tuple(tokens)


def hit_stop(tokens: Sequence[int], stop_ids: Sequence[int]) -> bool:
    return any(t in stop_ids for t in tokens)


def _prefill(target: TargetModel, prompt: Sequence[int]) -> tuple[TargetCache, int, Tensor]:
    """Run the prompt into a fresh cache: (cache, first greedy token, prompt features)."""
    cache = target.new_cache()
    logits, feats = target.forward_cached(torch.tensor([list(prompt)], device=target.device),
                                          cache, 0)
    return cache, int(logits[0, -1].argmax()), feats


@torch.no_grad()
def target_greedy(target: TargetModel, prompt: Sequence[int], *, max_new_tokens: int,
                  stop_ids: Sequence[int] = ()) -> DecodeResult:
    """The reference: one target forward per token, with a KV cache."""
    device = target.device
    sync_device(device)
    t0 = time.perf_counter()
    cache, first, _ = _prefill(target, prompt)
    tokens = [first]
    forwards = 0
    while len(tokens) < max_new_tokens and not hit_stop(tokens[-1:], stop_ids):
        pos = len(prompt) + len(tokens) - 1
        logits, _ = target.forward_cached(torch.tensor([[tokens[-1]]], device=device), cache, pos)
        tokens.append(int(logits[0, -1].argmax()))
        forwards += 1
    sync_device(device)
    return DecodeResult(finish(tokens, max_new_tokens, stop_ids), forwards,
                        time.perf_counter() - t0)


def check_max_draft(max_draft: int | None, block_size: int) -> int:
    """The drafts a cycle verifies: ``max_draft``, or all B-1 of a block when None."""
    if max_draft is None:
        return block_size - 1
    if not 0 <= max_draft <= block_size - 1:
        raise ValueError(f"max_draft must be in [0, {block_size - 1}] for a drafter of "
                         f"block size {block_size}, got {max_draft}")
    return max_draft


@torch.no_grad()
def speculative_greedy(target: TargetModel, drafter: DFlashDrafter, prompt: Sequence[int], *,
                       max_new_tokens: int, stop_ids: Sequence[int] = (),
                       max_draft: int | None = None) -> DecodeResult:
    """Greedy speculative decoding with the DFlash drafter; each cycle verifies at most
    ``max_draft`` drafts (default: all B-1 of a block), never more than the tokens still
    to generate."""
    max_draft = check_max_draft(max_draft, drafter.cfg.block_size)
    device = target.device
    sync_device(device)
    t0 = time.perf_counter()
    cache, first, feats = _prefill(target, prompt)
    tokens = [first]
    stream = DraftStream(drafter, target)
    pending_1TF = feats
    accepted: list[int] = []
    drafted: list[int] = []
    anchor_1 = torch.tensor([first], device=device)  # the last token, kept on the device
    while len(tokens) < max_new_tokens and not hit_stop(tokens, stop_ids):
        p = len(prompt) + len(tokens) - 1
        k = min(max_draft, max_new_tokens - len(tokens) - 1)
        draft_logits = stream.draft(tokens[-1], p, pending_1TF)
        drafts_k = draft_logits[1:1 + k].argmax(dim=-1)
        verify_logits, verify_feats = target.forward_cached(
            torch.cat([anchor_1, drafts_k])[None], cache, p)
        truth_k1 = verify_logits[0].argmax(dim=-1)
        # One wait for the device a cycle: drafts and the target's choices together.
        both = torch.cat([drafts_k, truth_k1]).tolist()
        drafts, truth = both[:k], both[k:]
        n = next((i for i in range(k) if drafts[i] != truth[i]), k)
        tokens.extend([*drafts[:n], truth[n]])
        anchor_1 = truth_k1[n:n + 1]
        accepted.append(n + 1)
        drafted.append(k)
        target.crop_cache(cache, p + n + 1)
        pending_1TF = verify_feats[:, : n + 1]
    sync_device(device)
    return DecodeResult(finish(tokens, max_new_tokens, stop_ids), len(accepted),
                        time.perf_counter() - t0, tuple(accepted), tuple(drafted))


@torch.no_grad()
def ngram_greedy(target: TargetModel, prompt: Sequence[int], *, max_new_tokens: int,
                 stop_ids: Sequence[int] = (), max_draft: int = 15,
                 n_max: int = DEFAULT_N_MAX, n_min: int = DEFAULT_N_MIN) -> DecodeResult:
    """The same draft-verify loop with prompt-lookup drafts (:func:`dflash.ngram.speculate`
    over the target's KV cache): the baseline with no drafter model."""
    device = target.device
    sync_device(device)
    t0 = time.perf_counter()
    got = speculate(TargetVerifier(target), prompt, max_new_tokens=max_new_tokens,
                    max_draft=max_draft, stop_ids=stop_ids, n_max=n_max, n_min=n_min)
    sync_device(device)
    return DecodeResult(got.tokens, got.target_forwards, time.perf_counter() - t0,
                        got.accepted, got.drafted)


class Decoder(Protocol):
    """One prompt decoded greedily by some speculative method."""

    def __call__(self, prompt: Sequence[int], *, max_new_tokens: int,
                 stop_ids: Sequence[int] = ()) -> DecodeResult: ...


def dflash_decoder(target: TargetModel, drafter: DFlashDrafter,
                   max_draft: int | None = None) -> Decoder:
    max_draft = check_max_draft(max_draft, drafter.cfg.block_size)

    def decode(prompt: Sequence[int], *, max_new_tokens: int,
               stop_ids: Sequence[int] = ()) -> DecodeResult:
        return speculative_greedy(target, drafter, prompt, max_new_tokens=max_new_tokens,
                                  stop_ids=stop_ids, max_draft=max_draft)
    return decode


def ngram_decoder(target: TargetModel, *, max_draft: int, n_max: int = DEFAULT_N_MAX,
                  n_min: int = DEFAULT_N_MIN) -> Decoder:
    if max_draft < 0:
        raise ValueError(f"max_draft must be >= 0, got {max_draft}")

    def decode(prompt: Sequence[int], *, max_new_tokens: int,
               stop_ids: Sequence[int] = ()) -> DecodeResult:
        return ngram_greedy(target, prompt, max_new_tokens=max_new_tokens, stop_ids=stop_ids,
                            max_draft=max_draft, n_max=n_max, n_min=n_min)
    return decode
