"""The DFlash training attention mask, as one predicate with three consumers.

KV = [target context (S positions) | draft blocks (N*B)], Q = draft blocks (N*B).
A query in block n (anchor a_n) sees:
  1. context key j iff j < a_n, strictly: at inference the anchor (bonus token) has
     no target hidden state yet (the ``<=`` bug, SpecForge#473);
  2. every token of its own block, bidirectionally, slot 0 included (a causal block
     was SpecForge#427);
  3. nothing from any other block; a padding block (keep False) sees nothing.

``_visible`` is the single predicate. ``dflash_mask_mod`` wraps it for flex (applied
inside partial tiles); ``dense_mask`` evaluates it on broadcast index grids for the
SDPA path; ``reference_mask`` is a plain loop, used only as a test oracle.

flex's tile map (which 128x128 tiles to visit, which of them are fully visible) comes
from :func:`block_mask_from_anchors`: arithmetic on the anchors at tile granularity,
O(batch x Q/128 x KV/128), with nothing to compile. ``create_block_mask`` evaluates the
predicate on every (q, kv) pair instead, and compiling it for the trainer's shapes took
200-240 s of the 296 s cold start on the H200 (``benchmarks/flex_compile_probe.py``);
it remains the fallback for block sizes that do not divide 128, and the test oracle.

Fully masked rows (padding blocks) -- the choice made here: their attention output is
exactly zero in both paths. flex already returns zeros for a row with no visible key;
the SDPA path uses a finite ``finfo.min`` bias (never -inf, which gives NaN) and then
zeroes those rows. The loss never reads padding blocks (keep False), so the zeros only
keep NaN out of the residual stream and out of the backward.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.attention.flex_attention import BlockMask, create_block_mask, flex_attention

MaskMod = Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]
AttendFn = Callable[[Tensor, Tensor, Tensor], Tensor]
"""(q_BHQd, k_BHKd, v_BHKd) -> out_BHQd; K/V heads already repeated to H."""


def _as_batched(anchors: Tensor, keep: Tensor) -> tuple[Tensor, Tensor]:
    """Accept [N] (one sequence) or [batch, N]; return [batch, N] long / bool."""
    if anchors.dim() == 1:
        anchors, keep = anchors[None], keep[None]
    if anchors.shape != keep.shape or anchors.dim() != 2:
        raise ValueError(f"anchors {tuple(anchors.shape)} and keep {tuple(keep.shape)} "
                         "must both be [N] or [batch, N]")
    return anchors.long(), keep.bool()


def _visible(anchors_BN: Tensor, keep_BN: Tensor, ctx_len: int, block_size: int,
             b: Tensor, q: Tensor, kv: Tensor) -> Tensor:
    """The predicate. b, q, kv are index tensors that broadcast against each other."""
    num_blocks = anchors_BN.shape[1]
    # create_block_mask pads Q_LEN up to its BLOCK_SIZE (128), so q can reach past N*B;
    # clamp before indexing (unclamped: device-side assert, SpecForge#501/#511) and
    # mask those rows out with in_range.
    in_range = q < num_blocks * block_size
    qb = torch.clamp(q // block_size, max=num_blocks - 1)
    anchor = anchors_BN[b, qb]
    ctx = (kv < ctx_len) & (kv < anchor)
    own_block = (kv >= ctx_len) & ((kv - ctx_len) // block_size == qb)
    return (ctx | own_block) & keep_BN[b, qb] & in_range


def dflash_mask_mod(anchors_N: Tensor, keep_N: Tensor, ctx_len: int,
                    block_size: int) -> MaskMod:
    """mask_mod(b, h, q_idx, kv_idx) for flex_attention; anchors/keep are [N] or [batch, N].

    Anchors change every step, so build a fresh BlockMask every step; never cache one.
    """
    anchors_BN, keep_BN = _as_batched(anchors_N, keep_N)

    def mask_mod(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return _visible(anchors_BN, keep_BN, ctx_len, block_size, b, q_idx, kv_idx)

    return mask_mod


def dflash_block_mask(anchors_N: Tensor, keep_N: Tensor, ctx_len: int, block_size: int,
                      builder: Callable[..., BlockMask] = create_block_mask) -> BlockMask:
    """The flex BlockMask; pass a ``torch.compile``d ``create_block_mask`` as ``builder``
    on GPU so it builds block-sparse instead of materializing [Q, KV]."""
    anchors_BN, keep_BN = _as_batched(anchors_N, keep_N)
    batch, num_blocks = anchors_BN.shape
    q_len = num_blocks * block_size
    return builder(dflash_mask_mod(anchors_BN, keep_BN, ctx_len, block_size), B=batch,
                   H=None, Q_LEN=q_len, KV_LEN=ctx_len + q_len, device=anchors_BN.device)


TILE = 128  # flex_attention's default BLOCK_SIZE, for both Q and KV


def block_mask_from_anchors(anchors_N: Tensor, keep_N: Tensor, ctx_len: int,
                            block_size: int) -> BlockMask:
    """The flex BlockMask built directly from the anchors (needs ``TILE % block_size ==
    0``). Tile (r, c) is visited if any query row of it sees any key of it, and is full
    if every row sees every key; the result equals ``create_block_mask``'s."""
    if TILE % block_size:
        raise ValueError(f"block size {block_size} does not divide {TILE}")
    anchors_BN, keep_BN = _as_batched(anchors_N, keep_N)
    batch, n = anchors_BN.shape
    dev = anchors_BN.device
    per = TILE // block_size  # draft blocks per query tile
    q_len, kv_len = n * block_size, ctx_len + n * block_size
    rows, cols = -(-q_len // TILE), -(-kv_len // TILE)
    pad = rows * per - n  # blocks past N: rows create_block_mask pads, never visible
    keep = F.pad(keep_BN, (0, pad), value=False)
    # Context keys a row of block n sees: [0, min(a_n, S)) if kept, else none.
    ctx_end = torch.where(keep, F.pad(anchors_BN, (0, pad)).clamp(max=ctx_len), 0)
    ctx_end_BRP = ctx_end.view(batch, rows, per)
    col_start = torch.arange(cols, device=dev) * TILE
    any_ctx = col_start < ctx_end_BRP.amax(-1, keepdim=True)
    full = col_start + TILE <= ctx_end_BRP.amin(-1, keepdim=True)
    # Own-block keys: block b's keys span at most two key tiles.
    first = ctx_len + torch.arange(rows * per, device=dev) * block_size
    own = torch.zeros(batch, rows, cols, dtype=torch.int8, device=dev)
    for edge in (first, first + block_size - 1):
        tile = (edge // TILE).clamp(max=cols - 1).view(1, rows, per).expand(batch, -1, -1)
        own.scatter_reduce_(-1, tile, keep.view(batch, rows, per).to(torch.int8), "amax")
    if per == 1:  # block_size == TILE: a block's own keys can fill a whole key tile
        start = (ctx_len + torch.arange(rows, device=dev) * TILE)[:, None]
        end = ctx_end_BRP[..., 0, None]  # each row's visible context [0, end)
        # Visible keys are [0, end) and [start, start + TILE); they touch (one interval)
        # only for block 0 with every context key visible.
        full |= keep.view(batch, rows, 1) & ((col_start == start)
                                             | ((end == start) & (col_start <= start)))
    partial = (any_ctx | own.bool()) & ~full

    def ordered(tiles_BRC: Tensor) -> tuple[Tensor, Tensor]:
        num = tiles_BRC.sum(-1, dtype=torch.int32)[:, None]
        idx = torch.argsort(tiles_BRC.to(torch.int8), dim=-1, descending=True, stable=True)
        return num, idx.to(torch.int32)[:, None]

    kv_num, kv_idx = ordered(partial)
    full_num, full_idx = ordered(full)
    return BlockMask.from_kv_blocks(kv_num, kv_idx, full_num, full_idx, BLOCK_SIZE=TILE,
                                    mask_mod=dflash_mask_mod(anchors_BN, keep_BN, ctx_len,
                                                             block_size),
                                    seq_lengths=(q_len, kv_len))


def dense_mask(anchors_N: Tensor, keep_N: Tensor, ctx_len: int, block_size: int) -> Tensor:
    """Boolean [batch, Q, S+Q] mask (True = may attend) from the same predicate."""
    anchors_BN, keep_BN = _as_batched(anchors_N, keep_N)
    batch, num_blocks = anchors_BN.shape
    q_len = num_blocks * block_size
    dev = anchors_BN.device
    b = torch.arange(batch, device=dev)[:, None, None]
    q = torch.arange(q_len, device=dev)[None, :, None]
    kv = torch.arange(ctx_len + q_len, device=dev)[None, None, :]
    return _visible(anchors_BN, keep_BN, ctx_len, block_size, b, q, kv)


def reference_mask(anchors: list[int], keep: list[bool], ctx_len: int,
                   block_size: int) -> list[list[bool]]:
    """Plain-Python oracle for one sequence, written from the rules, not the predicate."""
    n_blocks = len(anchors)
    q_len = n_blocks * block_size
    rows = []
    for q in range(q_len):
        blk = q // block_size
        row = []
        for kv in range(ctx_len + q_len):
            if not keep[blk]:
                row.append(False)
            elif kv < ctx_len:
                row.append(kv < anchors[blk])
            else:
                row.append(blk * block_size <= kv - ctx_len < (blk + 1) * block_size)
        rows.append(row)
    return rows


def flex_attend(block_mask: BlockMask, flex_fn: Callable[..., Tensor] = flex_attention
                ) -> AttendFn:
    """Attention through flex. Pass a compiled flex_attention as ``flex_fn`` on GPU; the
    eager default runs an unfused path (fine for tiny CPU tests, forward only on CPU)."""

    def attend(q_BHQd: Tensor, k_BHKd: Tensor, v_BHKd: Tensor) -> Tensor:
        return flex_fn(q_BHQd, k_BHKd, v_BHKd, block_mask=block_mask)

    return attend


def sdpa_attend(mask_BQK: Tensor | None) -> AttendFn:
    """Attention through SDPA with a dense boolean mask; ``None`` means see everything
    (the decode path: cache + own block, bidirectional; is_causal must stay False)."""
    if mask_BQK is None:
        def attend_all(q_BHQd: Tensor, k_BHKd: Tensor, v_BHKd: Tensor) -> Tensor:
            return F.scaled_dot_product_attention(q_BHQd, k_BHKd, v_BHKd, is_causal=False)
        return attend_all

    mask_B1QK = mask_BQK[:, None]
    any_B1Q1 = mask_B1QK.any(dim=-1, keepdim=True)

    def attend(q_BHQd: Tensor, k_BHKd: Tensor, v_BHKd: Tensor) -> Tensor:
        # Finite bias, not a bool mask or -inf: an all-masked row then softmaxes to a
        # harmless uniform average instead of NaN, and we zero it (matching flex).
        bias = torch.zeros(mask_B1QK.shape, dtype=q_BHQd.dtype, device=q_BHQd.device)
        bias = bias.masked_fill(~mask_B1QK, torch.finfo(q_BHQd.dtype).min)
        out = F.scaled_dot_product_attention(q_BHQd, k_BHKd, v_BHKd, attn_mask=bias)
        return out * any_B1Q1.to(out.dtype)

    return attend
