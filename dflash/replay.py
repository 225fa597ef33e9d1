"""Greedy speculative decoding replayed on stored rows, teacher forced: a τ that walks
the way decoding walks, from one target forward and one drafter forward per batch.

Why not the mean acceptance over random anchors (the trainer's ``held_out_tau_random``)?
It read 11.6 where decoding held-out prompts gave 6.13, for two reasons. It weights every
position alike, while decoding visits positions as a renewal process: after n accepted
drafts it jumps n+1 positions, so a long predictable stretch is one cycle to decoding but
many anchors to the mean. And it scores anchors anywhere in a long response, while
``dflash-eval`` decodes only the first ``max_new_tokens`` tokens after the prompt.

So :func:`replay` does what :func:`dflash.decoding.speculative.speculative_greedy` does,
on a row ``prompt + response``: the first generated token (the target's greedy choice
after the prompt, at position L = the prompt's length) is the first anchor; a cycle at
anchor p drafts k = min(B-1, tokens left in the window - 1) tokens, accepts the n
leading ones that equal the target's greedy choice at p, p+1, ..., emits n+1 (the n and
the target's bonus token), and the next anchor is p+n+1; the walk ends when the window's
W tokens are out or a stop id was emitted. τ = tokens / cycles over every cycle of every
row, as ``dflash-eval`` counts it.

Teacher forcing stands in for the caches: the target runs the row once (its greedy
choice and its features at every position), and the drafter runs a block at every
anchor of the window at once, each seeing the features before its anchor (the training
mask, :mod:`dflash.masks`), exactly what its cache holds at that anchor while decoding.
That holds only while the row IS decoding's output, so acceptance is judged against the
target's argmax, not the stored labels, and where the stored response leaves the
target's greedy choice (or ends) decoding would go elsewhere: the row's walk stops there,
its last cycle cut at that position (exact when the drafts already missed before it, a
lower bound otherwise), and the row is counted in :attr:`Replay.diverged` (or
:attr:`Replay.ended`).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from enum import Enum

import torch
from torch import Tensor

from dflash.decoding.speculative import check_max_draft
from dflash.loss import block_inputs
from dflash.masks import dense_mask, sdpa_attend
from dflash.model import DFlashDrafter
from dflash.target import TargetModel

Row = tuple[Sequence[int], int]
"""A stored row's token ids and its prompt's length (the position of the first response
token, which decoding's first cycle takes as its anchor)."""


class End(Enum):
    """How a row's walk ended."""

    DONE = "done"
    """The window's tokens are out, or a stop id was emitted: where decoding stops."""
    DIVERGED = "diverged"
    """The stored response left the target's greedy choice inside the window."""
    ENDED = "ended"
    """The stored row ended inside the window (and before a stop id)."""


@dataclass(frozen=True, slots=True)
class Replay:
    cycles: tuple[int, ...]
    """Tokens emitted per cycle (accepted drafts + 1), row after row."""
    rows: int
    diverged: int
    """Rows whose walk stopped where the stored response left the target's greedy choice."""
    ended: int
    """Rows whose walk stopped where the stored row ended, before the window's end."""

    @property
    def tau(self) -> float:
        """Tokens per cycle (1.0 with no cycle, as :func:`dflash.heldout.decode_tau`)."""
        return sum(self.cycles) / len(self.cycles) if self.cycles else 1.0

    @property
    def stopped(self) -> int:
        """Rows the walk could not follow to the window's end."""
        return self.diverged + self.ended


def walk(ids: Sequence[int], start: int, greedy: Sequence[int],
         drafts: Sequence[Sequence[int]], *, window: int, max_draft: int,
         stop_ids: Collection[int] = ()) -> tuple[list[int], End]:
    """One row's cycles (tokens emitted per cycle) and how its walk ended.

    ``greedy[i]``: the target's argmax at position i (the token it would put at i+1), for
    i < start + window - 1; ``drafts[j][s]``: the drafter's argmax at slot s of the block
    anchored at position start + j, for j < window - 1. Decoding emits the target's
    greedy choice after the prompt first, outside any cycle; the walk starts there.
    """
    if start < 1:
        raise ValueError(f"a row needs a prompt of at least one token, got start={start}")
    end = len(ids)

    def leaves(q: int) -> bool:  # the stored row no longer shows what decoding emits at q
        return q >= end or ids[q] != greedy[q - 1]

    cycles: list[int] = []
    if window <= 1:  # decoding emits the first token, in no cycle, and is done
        return cycles, End.DONE
    if leaves(start):
        return cycles, End.ENDED if start >= end else End.DIVERGED
    if ids[start] in stop_ids:
        return cycles, End.DONE
    made, p = 1, start
    while made < window:
        k = min(max_draft, window - made - 1)
        block = drafts[p - start]
        n = next((i for i in range(k) if block[i + 1] != greedy[p + i]), k)
        m = next((j for j in range(1, n + 2) if leaves(p + j)), None)
        emitted = n + 1 if m is None else min(n, m) + 1
        cycles.append(emitted)
        made += emitted
        # greedy[p .. p+j-1] is decoding's token at p+1 .. p+j for every j <= m
        known = greedy[p:p + (emitted if m is None else min(emitted, m))]
        if any(t in stop_ids for t in known):
            return cycles, End.DONE
        if m is not None:
            return cycles, End.ENDED if p + m >= end else End.DIVERGED
        p += emitted
    return cycles, End.DONE


@torch.no_grad()
def block_choices(target: TargetModel, drafter: DFlashDrafter, ids_BT: Tensor,
                  starts_B: Tensor, window: int, *, dtype: torch.dtype,
                  chunk: int = 4096) -> tuple[Tensor, Tensor]:
    """The target's argmax at every position [B, T] and the drafter's at every slot of
    the blocks anchored at start .. start+window-2 [B, window-1, block_size], from one
    target forward (choices and features together) and one drafter forward with the
    training mask; the drafter's LM head runs ``chunk`` rows at a time."""
    bs = drafter.cfg.block_size
    logits_BTV, feats_BTF = target.forward_cached(ids_BT, target.new_cache(), 0)
    greedy_BT = logits_BTV.argmax(dim=-1)
    del logits_BTV
    bsz, seq = ids_BT.shape
    anchors_BN = starts_B[:, None] + torch.arange(window - 1, device=ids_BT.device)
    keep_BN = torch.ones_like(anchors_BN, dtype=torch.bool)
    blocks_BQ, pos_BQ = block_inputs(ids_BT, anchors_BN, bs, drafter.cfg.mask_token_id)
    emb_BQD = target.embed(blocks_BQ).to(dtype)
    pos_ctx_BT = torch.arange(seq, device=ids_BT.device).expand(bsz, seq)
    hidden_BQD = drafter(emb_BQD, feats_BTF.to(dtype), pos_BQ, pos_ctx_BT,
                         sdpa_attend(dense_mask(anchors_BN, keep_BN, seq, bs)))
    flat_MD = hidden_BQD.reshape(-1, hidden_BQD.shape[-1])
    drafts_M = torch.cat([target.lm_head(flat_MD[i:i + chunk]).argmax(dim=-1)
                          for i in range(0, flat_MD.shape[0], chunk)])
    return greedy_BT, drafts_M.view(bsz, window - 1, bs)


@torch.no_grad()
def replay(target: TargetModel, drafter: DFlashDrafter, rows: Sequence[Row], *,
           window: int, batch_size: int, stop_ids: Collection[int] = (),
           max_draft: int | None = None, dtype: torch.dtype | None = None) -> Replay:
    """Decoding's walk over ``rows`` (see the module), ``batch_size`` rows a forward: each
    row is cut to its first prompt + ``window`` tokens and right-padded (causal, so the
    padding changes no real position)."""
    max_draft = check_max_draft(max_draft, drafter.cfg.block_size)
    dtype = dtype or next(drafter.parameters()).dtype
    cycles: list[int] = []
    ends: list[End] = []
    for first in range(0, len(rows), batch_size):
        batch = [(list(ids[:start + window]), start) for ids, start in
                 rows[first:first + batch_size]]
        if window > 1:
            seq = max(start for _, start in batch) + window
            ids_BT = torch.tensor([ids + [0] * (seq - len(ids)) for ids, _ in batch],
                                  device=target.device)
            starts_B = torch.tensor([start for _, start in batch], device=target.device)
            greedy_BT, drafts_BNK = block_choices(target, drafter, ids_BT, starts_B, window,
                                                  dtype=dtype)
            greedy, drafts = greedy_BT.tolist(), drafts_BNK.tolist()  # one wait a batch
        else:  # nothing to draft: decoding emits the first token only, in no cycle
            greedy, drafts = [[] for _ in batch], [[] for _ in batch]
        for (ids, start), row_greedy, row_drafts in zip(batch, greedy, drafts, strict=True):
            got, end = walk(ids, start, row_greedy, row_drafts, window=window,
                            max_draft=max_draft, stop_ids=stop_ids)
            cycles.extend(got)
            ends.append(end)
    return Replay(cycles=tuple(cycles), rows=len(rows), diverged=ends.count(End.DIVERGED),
                  ended=ends.count(End.ENDED))
