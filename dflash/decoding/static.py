"""The decode cycle with fixed shapes: a static KV cache, captured in CUDA graphs on a GPU.

At batch 1 a cycle's time is its kernel launches: on the H200 the eager DFlash cycle of
an 88 M target cost 2.12 target forwards, the drafter's five layers over 16 positions
being microseconds of GPU work behind milliseconds of dispatch. Here both halves of a
cycle run on preallocated tensors whose shapes never change, so each can be recorded
once as a CUDA graph and replayed with one launch:

- :class:`StaticCache`: per-layer K/V buffers of a fixed number of slots, written in
  place at the slots a forward names (``where``, a device tensor); slot i holds position
  i. Cropping is free: a position past the accepted text is never visible (the masks
  below) and is overwritten before it could be;
- :class:`StaticTarget`: the target (dflash's own Qwen3) over T = max_draft + 1 tokens at
  a position held on the device: the greedy token after each and the tapped features.
  A shorter block is padded; what the padding writes lies past the accepted text. Its
  rows run through :meth:`StaticTarget.rows`, which takes any slots and mask: the
  hybrid's two-branch verify (:mod:`dflash.decoding.branches`) lays the drafter's and
  prompt lookup's drafts side by side through it, the lookup's K/V in ``spare`` slots
  past the positions;
- :class:`StaticDrafter`: the drafter's block step over a context buffer of C rows, of
  which the first ``n_ctx`` are new context (the rest go to junk slots no query sees),
  and the block at the anchor's position; the drafts are the argmax on the device.

A ``prefill`` (any length) runs the same functions uncaptured. On CPU nothing is
captured (:func:`graphs_for`): the same code runs eagerly, which is what the CPU tests
compare with the dynamic-cache path and with target-only greedy decoding, token for token.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from dflash import qwen3
from dflash.masks import AttendFn
from dflash.model import DFlashDrafter, KVCache, rope_cos_sin
from dflash.target import TargetModel

SLOT_FLOOR = 512
"""The fewest slots a cache is made with; it doubles when a prompt needs more."""


def graphs_for(device: torch.device) -> bool:
    """Capture in CUDA graphs only on a CUDA device (a CPU has nothing to capture)."""
    return device.type == "cuda"


def supports(target: TargetModel) -> bool:
    """The static cycle runs dflash's own Qwen3 (its layers take any K/V store)."""
    return isinstance(target.model, qwen3.Qwen3ForCausalLM)


def slots_for(needed: int, have: int = 0) -> int:
    """A cache size of at least ``needed`` slots: ``have`` if enough, else the floor
    doubled until it fits."""
    if needed <= have:
        return have
    size = SLOT_FLOOR
    while size < needed:
        size *= 2
    return size


class StaticCache(KVCache):
    """K/V buffers [batch, G, slots, d] per layer, written in place at ``where`` (the slot
    of each new position, a device tensor set before a forward; every row's the same)."""

    def __init__(self, num_layers: int, kv_heads: int, head_dim: int, slots: int, *,
                 dtype: torch.dtype, device: torch.device, batch: int = 1) -> None:
        super().__init__(num_layers)
        self.slots = slots
        # Zeros, not empty: a slot no query sees is still multiplied by a zero weight,
        # and 0 x NaN from uninitialised memory would poison the row.
        self.keys = [torch.zeros(batch, kv_heads, slots, head_dim, dtype=dtype,
                                 device=device) for _ in range(num_layers)]
        self.values = [torch.zeros_like(k) for k in self.keys]
        self.k, self.v = list(self.keys), list(self.values)
        self.where = torch.zeros(0, dtype=torch.long, device=device)

    def update(self, layer: int, k_BGTd: Tensor, v_BGTd: Tensor) -> tuple[Tensor, Tensor]:
        k, v = self.keys[layer], self.values[layer]
        k.index_copy_(2, self.where, k_BGTd)
        v.index_copy_(2, self.where, v_BGTd)
        return k, v

    def crop(self, length: int) -> None:
        raise TypeError("a static cache is not cropped: its masks hide what lies past the text")


def _attend_where(visible_QK: Tensor) -> AttendFn:
    def attend(q_BHQd: Tensor, k_BHKd: Tensor, v_BHKd: Tensor) -> Tensor:
        return torch.nn.functional.scaled_dot_product_attention(
            q_BHQd, k_BHKd, v_BHKd, attn_mask=visible_QK)
    return attend


class Captured:
    """``fn`` (no arguments; it reads and writes fixed tensors), recorded as a CUDA graph
    when ``graphs`` is on, else called as it is. ``run()`` returns its outputs: the same
    tensors every call when captured, so read them before the next call. The capture
    checks this thread's calls only (CUDA's thread-local mode): other threads may use the
    device meanwhile, as the trainer's data prefetch does beside its held-out decode and
    the placing does beside a captured generation."""

    def __init__(self, fn: Callable[[], tuple[Tensor, ...]], graphs: bool) -> None:
        self.fn = fn
        self.graph: torch.cuda.CUDAGraph | None = None
        self.out: tuple[Tensor, ...] = ()
        if graphs:
            side = torch.cuda.Stream()  # type: ignore[no-untyped-call]
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):  # warm-up: allocator and kernel choices
                for _ in range(2):
                    fn()
            torch.cuda.current_stream().wait_stream(side)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph, capture_error_mode="thread_local"):
                self.out = fn()

    def run(self) -> tuple[Tensor, ...]:
        if self.graph is None:
            return self.fn()
        self.graph.replay()
        return self.out


class StaticTarget:
    """The target's side of a cycle on a :class:`StaticCache`: ``verify`` runs the
    fixed-size block (captured), ``prefill`` a prompt (uncaptured)."""

    def __init__(self, target: TargetModel, block: int, slots: int, graphs: bool, *,
                 spare: int = 0) -> None:
        if not supports(target):
            raise ValueError("the static decode cycle runs dflash's own Qwen3 targets only")
        self.target = target
        self.model: qwen3.Qwen3ForCausalLM = target.model
        cfg = self.model.config
        device = target.device
        self.block = block
        self.slots = slots
        """Slots that hold positions (slot i: position i); ``spare`` more lie past them
        (the lookup branch's region of :mod:`dflash.decoding.branches`), which no query
        of :meth:`forward` sees: every spare slot is past every position."""
        self.cache = StaticCache(cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim,
                                 slots + spare, dtype=target.dtype, device=device)
        self.slot_ids = torch.arange(slots + spare, device=device)
        self.ids_1T = torch.zeros(1, block, dtype=torch.long, device=device)
        self.start = torch.zeros((), dtype=torch.long, device=device)
        self.taps = frozenset(target.layer_ids)
        self.step = Captured(lambda: self.forward(self.ids_1T, self.start), graphs)

    def forward(self, ids_1T: Tensor, start: Tensor) -> tuple[Tensor, Tensor]:
        """The greedy token after each of T tokens at positions start.. ([T]) and their
        tapped features [1, T, k*H]."""
        pos_T = start + torch.arange(ids_1T.shape[1], device=ids_1T.device)
        return self.rows(ids_1T, pos_T, pos_T, self.slot_ids[None, :] <= pos_T[:, None])

    def rows(self, ids_1N: Tensor, pos_N: Tensor, where_N: Tensor, seen_NK: Tensor
             ) -> tuple[Tensor, Tensor]:
        """The target over N tokens at positions ``pos_N``, their K/V written to the slots
        ``where_N``, row i attending to the slots ``seen_NK[i]``: the greedy token after
        each [N] and the tapped features [1, N, k*H]. :meth:`forward` is one causal run
        (slot = position); the two-branch verify lays two drafts side by side with it."""
        body = self.model.model
        self.cache.where = where_N
        x_1ND: Tensor = body.embed_tokens(ids_1N)
        rope = rope_cos_sin(pos_N[None], body.inv_freq, x_1ND.dtype)
        taps = []
        for i, layer in enumerate(body.layers):
            x_1ND = layer(x_1ND, rope, seen_NK, self.cache, i)
            if i in self.taps:
                taps.append(x_1ND)
        logits_1NV: Tensor = self.model.lm_head(body.norm(x_1ND))
        return logits_1NV[0].argmax(dim=-1), torch.cat(taps, dim=-1)

    @torch.no_grad()
    def prefill(self, prompt: Sequence[int]) -> tuple[int, Tensor]:
        """The prompt into the cache from slot 0: (the greedy token after it, its
        features [1, P, k*H])."""
        ids = torch.tensor([list(prompt)], dtype=torch.long, device=self.target.device)
        truth_P, feats = self.forward(ids, torch.zeros((), dtype=torch.long,
                                                       device=self.target.device))
        return int(truth_P[-1]), feats

    @torch.no_grad()
    def verify(self, block_1M: Tensor, start: int) -> tuple[Tensor, Tensor]:
        """The M <= T tokens of ``block_1M`` at ``start``: the greedy token after each [M]
        and the features [1, T, k*H] (rows past M are padding). Both are the captured
        outputs: use them before the next call."""
        m = block_1M.shape[1]
        if start + self.block > self.slots:
            raise ValueError(f"a block at {start} runs past the cache's {self.slots} slots")
        self.ids_1T[:, :m].copy_(block_1M)
        self.start.fill_(start)
        truth_T, feats_1TF = self.step.run()
        return truth_T[:m], feats_1TF


class StaticDrafter:
    """The drafter's side: new context features are staged in a buffer of ``rows`` rows
    (:meth:`feed`); :meth:`draft` runs the block at the anchor over them (captured).
    A stage that fills up is run at once (its drafts unused) to make room."""

    def __init__(self, drafter: DFlashDrafter, target: TargetModel, rows: int, slots: int,
                 graphs: bool) -> None:
        cfg = drafter.cfg
        device = target.device
        self.drafter, self.target = drafter, target
        self.dtype = next(drafter.parameters()).dtype
        self.block = cfg.block_size
        self.rows = rows
        # Slots past ``slots`` take the rows of a stage that are not context: no query
        # sees them (every visible slot is before the block's end).
        self.cache = StaticCache(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim,
                                 slots + rows, dtype=self.dtype, device=device)
        self.junk = slots
        self.slot_ids = torch.arange(slots + rows, device=device)
        self.row_ids = torch.arange(rows, device=device)
        self.block_ids = torch.arange(cfg.block_size, device=device)
        self.masks = torch.full((cfg.block_size - 1,), cfg.mask_token_id, dtype=torch.long,
                                device=device)
        self.stage = torch.zeros(1, rows, target.feature_dim, dtype=target.dtype, device=device)
        self.anchor = torch.zeros(1, dtype=torch.long, device=device)
        self.at = torch.zeros((), dtype=torch.long, device=device)
        self.n_ctx = torch.zeros((), dtype=torch.long, device=device)
        self.staged = 0
        self.length = 0
        """Context positions in the cache (the next stage starts there)."""
        self.step = Captured(lambda: self.forward(self.stage, self.n_ctx, self.anchor,
                                                  self.at), graphs)

    def forward(self, feats_1CF: Tensor, n_ctx: Tensor, anchor_1: Tensor, at: Tensor
                ) -> tuple[Tensor]:
        """Drafts [B-1] for the block at position ``at`` whose new context is the first
        ``n_ctx`` rows of ``feats_1CF`` (positions at-n_ctx .. at-1)."""
        device = feats_1CF.device
        rows_C = torch.arange(feats_1CF.shape[1], device=device)
        pos_ctx_C = at - n_ctx + rows_C
        pos_block_B = at + self.block_ids
        ctx_slot_C = torch.where(rows_C < n_ctx, pos_ctx_C, self.junk + rows_C)
        self.cache.where = torch.cat([ctx_slot_C, pos_block_B])
        visible_1K = (self.slot_ids < at + self.block)[None]
        emb_1BD = self.target.embed(torch.cat([anchor_1, self.masks])[None]).to(self.dtype)
        hidden_1BD = self.drafter(emb_1BD, feats_1CF.to(self.dtype), pos_block_B[None],
                                  pos_ctx_C[None], _attend_where(visible_1K), self.cache)
        logits_QV: Tensor = self.target.lm_head(hidden_1BD[0, 1:])
        return (logits_QV.argmax(dim=-1),)

    def _run(self, anchor_1: Tensor | None) -> Tensor:
        if anchor_1 is not None:
            self.anchor.copy_(anchor_1)
        self.at.fill_(self.length + self.staged)
        self.n_ctx.fill_(self.staged)
        (drafts,) = self.step.run()
        self.length += self.staged
        self.staged = 0
        return drafts

    @torch.no_grad()
    def feed(self, feats_1RF: Tensor) -> None:
        """Stage the features of the next R context positions."""
        done = 0
        while done < feats_1RF.shape[1]:
            if self.staged == self.rows:
                self._run(None)  # a full stage: into the cache, drafts unused
            take = min(self.rows - self.staged, feats_1RF.shape[1] - done)
            self.stage[:, self.staged:self.staged + take].copy_(feats_1RF[:, done:done + take])
            self.staged += take
            done += take

    @torch.no_grad()
    def draft(self, anchor_1: Tensor, at: int) -> Tensor:
        """Drafts [B-1] (on the device) for the block at ``at``, whose context must all
        have been fed. The captured output: use it before the next call."""
        if self.length + self.staged != at:
            raise ValueError(f"the drafter holds {self.length + self.staged} context "
                             f"positions, but the anchor is at {at}")
        if at + self.block > self.junk:
            raise ValueError(f"a block at {at} runs past the cache's {self.junk} slots")
        return self._run(anchor_1)

    def reset(self) -> None:
        """A new prompt: nothing staged, nothing in the cache (old slots are hidden)."""
        self.staged = 0
        self.length = 0
