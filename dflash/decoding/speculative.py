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
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from dflash.masks import sdpa_attend
from dflash.meter import sync_device
from dflash.model import DFlashDrafter
from dflash.target import TargetModel

if TYPE_CHECKING:
    from transformers import DynamicCache


@dataclass(frozen=True, slots=True)
class DecodeResult:
    tokens: tuple[int, ...]
    """The generated tokens (after the prompt), cut at max_new_tokens or a stop id."""
    target_forwards: int
    """Target forward passes after the prefill (one per token, or one per cycle)."""
    seconds: float
    accepted: tuple[int, ...] = ()
    """Speculative only: tokens emitted per cycle (accepted drafts + 1)."""


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


def _finish(tokens: list[int], max_new_tokens: int, stop_ids: Sequence[int]) -> tuple[int, ...]:
    tokens = tokens[:max_new_tokens]
    for i, tok in enumerate(tokens):
        if tok in stop_ids:
            return tuple(tokens[: i + 1])
    return tuple(tokens)


def _hit_stop(tokens: Sequence[int], stop_ids: Sequence[int]) -> bool:
    return any(t in stop_ids for t in tokens)


def _prefill(target: TargetModel, prompt: Sequence[int]) -> tuple[DynamicCache, int, Tensor]:
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
    while len(tokens) < max_new_tokens and not _hit_stop(tokens[-1:], stop_ids):
        pos = len(prompt) + len(tokens) - 1
        logits, _ = target.forward_cached(torch.tensor([[tokens[-1]]], device=device), cache, pos)
        tokens.append(int(logits[0, -1].argmax()))
        forwards += 1
    sync_device(device)
    return DecodeResult(_finish(tokens, max_new_tokens, stop_ids), forwards,
                        time.perf_counter() - t0)


@torch.no_grad()
def speculative_greedy(target: TargetModel, drafter: DFlashDrafter, prompt: Sequence[int], *,
                       max_new_tokens: int, stop_ids: Sequence[int] = ()) -> DecodeResult:
    device = target.device
    sync_device(device)
    t0 = time.perf_counter()
    cache, first, feats = _prefill(target, prompt)
    tokens = [first]
    stream = DraftStream(drafter, target)
    pending_1TF = feats
    accepted: list[int] = []
    while len(tokens) < max_new_tokens and not _hit_stop(tokens, stop_ids):
        p = len(prompt) + len(tokens) - 1
        draft_logits = stream.draft(tokens[-1], p, pending_1TF)
        drafts = draft_logits[1:].argmax(dim=-1)
        block_1B = torch.cat([torch.tensor([tokens[-1]], device=device), drafts])[None]
        verify_logits, verify_feats = target.forward_cached(block_1B, cache, p)
        truth = verify_logits[0].argmax(dim=-1)
        match = (drafts == truth[:-1]).int()
        n = int(match.cumprod(0).sum())
        tokens.extend([*drafts[:n].tolist(), int(truth[n])])
        accepted.append(n + 1)
        target.crop_cache(cache, p + n + 1)
        pending_1TF = verify_feats[:, : n + 1]
    sync_device(device)
    return DecodeResult(_finish(tokens, max_new_tokens, stop_ids), len(accepted),
                        time.perf_counter() - t0, tuple(accepted))


@dataclass(frozen=True, slots=True)
class Mismatch:
    prompt: int
    position: int
    target_token: int | None
    speculative_token: int | None

    def to_dict(self) -> dict[str, Any]:
        return {"prompt": self.prompt, "position": self.position,
                "target_token": self.target_token, "speculative_token": self.speculative_token}


@dataclass(frozen=True, slots=True)
class EvalReport:
    prompts: int
    tokens: int
    tau: float
    """Mean tokens per verify cycle (accepted drafts + bonus)."""
    target_seconds: float
    speculative_seconds: float
    lossless: bool
    mismatches: tuple[Mismatch, ...] = field(default=())
    acceptance_histogram: tuple[int, ...] = ()
    """Cycles that emitted 1, 2, ..., B tokens."""

    @property
    def speedup(self) -> float:
        return self.target_seconds / self.speculative_seconds if self.speculative_seconds else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"prompts": self.prompts, "tokens": self.tokens, "tau": self.tau,
                "target_seconds": self.target_seconds,
                "speculative_seconds": self.speculative_seconds, "speedup": self.speedup,
                "lossless": self.lossless,
                "mismatches": [m.to_dict() for m in self.mismatches],
                "acceptance_histogram": list(self.acceptance_histogram)}


def _first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    for i in range(max(len(a), len(b))):
        if i >= len(a) or i >= len(b) or a[i] != b[i]:
            return i
    return None


def evaluate(target: TargetModel, drafter: DFlashDrafter, prompts: Sequence[Sequence[int]], *,
             max_new_tokens: int, stop_ids: Sequence[int] = (), warmup: bool = True
             ) -> EvalReport:
    """Decode every prompt both ways: tau, wall-clock speedup, and token-level equality."""
    if not prompts:
        raise ValueError("no prompts to evaluate")
    if warmup:  # first calls allocate and pick kernels; keep them out of the timings
        target_greedy(target, prompts[0], max_new_tokens=min(8, max_new_tokens))
        speculative_greedy(target, drafter, prompts[0], max_new_tokens=min(8, max_new_tokens))
    t_sec = s_sec = 0.0
    tokens = 0
    cycles: list[int] = []
    mismatches = []
    for i, prompt in enumerate(prompts):
        ref = target_greedy(target, prompt, max_new_tokens=max_new_tokens, stop_ids=stop_ids)
        spec = speculative_greedy(target, drafter, prompt, max_new_tokens=max_new_tokens,
                                  stop_ids=stop_ids)
        t_sec += ref.seconds
        s_sec += spec.seconds
        tokens += len(spec.tokens)
        cycles.extend(spec.accepted)
        at = _first_difference(ref.tokens, spec.tokens)
        if at is not None:
            mismatches.append(Mismatch(
                i, at, ref.tokens[at] if at < len(ref.tokens) else None,
                spec.tokens[at] if at < len(spec.tokens) else None))
    histogram = [0] * drafter.cfg.block_size
    for n in cycles:
        histogram[n - 1] += 1
    return EvalReport(prompts=len(prompts), tokens=tokens,
                      tau=sum(cycles) / len(cycles) if cycles else 0.0,
                      target_seconds=t_sec, speculative_seconds=s_sec,
                      lossless=not mismatches, mismatches=tuple(mismatches),
                      acceptance_histogram=tuple(histogram))
