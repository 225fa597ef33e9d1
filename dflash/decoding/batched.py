"""Greedy generation of a batch of equal-length prompts, each decode step one CUDA graph.

The trainer's synthetic data is the target's greedy continuation of random prompts of one
length, 512 of them decoded as one batch at the 8B shape. Eagerly, each of the 96 steps
dispatches every operator of every layer from Python, about 1,800 a step, and each takes
the interpreter's lock again: beside the drafter's placing, whose imports hold that lock
(:class:`dflash.dataphase.DataPhase`), the loop took 8.1 s on a new H100 instead of 2.9 s.
Here the K/V cache is static (slot i holds position i of every row, the rows all at the
same position) and one step is recorded once: the forward at the position held on the
device, the greedy token into the output and into the next step's input, the position
advanced. It is then replayed once a token, so the loop asks the interpreter for nothing
but the replays.

:func:`applies` says where (dflash's own Qwen3 on a CUDA device, equal lengths, greedy,
no stop ids, at least 3 new tokens); elsewhere :mod:`dflash.decoding.generate`'s eager
loop runs, as before. The capture is thread-local, so the main thread may use the device
meanwhile. On a CPU the same functions run uncaptured, which is what the CPU tests compare
with the eager loop, token for token.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from dflash import qwen3
from dflash.decoding.static import Captured, StaticCache, graphs_for
from dflash.model import rope_cos_sin
from dflash.target import TargetModel

MIN_NEW_TOKENS = 3
"""The recording runs the step twice first (writing new-token columns 1 and 2)."""


def applies(target: TargetModel, padded: bool, temperature: float, stops: int,
            max_new_tokens: int) -> bool:
    """Whether a batch decodes here: ``padded`` (prompts of unequal lengths), a sampling
    ``temperature`` or any ``stops`` keep the eager loop."""
    return (isinstance(target.model, qwen3.Qwen3ForCausalLM) and graphs_for(target.device)
            and not padded and temperature <= 0 and not stops
            and max_new_tokens >= MIN_NEW_TOKENS)


class BatchedGreedy:
    """``batch`` prompts of ``prompt_len`` ids, ``max_new`` greedy tokens each."""

    def __init__(self, target: TargetModel, batch: int, prompt_len: int, max_new: int,
                 graphs: bool) -> None:
        if not isinstance(target.model, qwen3.Qwen3ForCausalLM):
            raise ValueError("batched static generation runs dflash's own Qwen3 only")
        if max_new < MIN_NEW_TOKENS:
            raise ValueError(f"max_new must be >= {MIN_NEW_TOKENS}, got {max_new}")
        cfg = target.model.config
        device = target.device
        self.model: qwen3.Qwen3ForCausalLM = target.model
        self.prompt_len, self.max_new = prompt_len, max_new
        slots = prompt_len + max_new
        self.cache = StaticCache(cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim,
                                 slots, dtype=target.dtype, device=device, batch=batch)
        self.slot_ids = torch.arange(slots, device=device)
        self.ids_B1 = torch.zeros(batch, 1, dtype=torch.long, device=device)
        self.pos = torch.full((), prompt_len, dtype=torch.long, device=device)
        self.out_BN = torch.zeros(batch, max_new, dtype=torch.long, device=device)
        # Recording runs the step twice on zeros: slots P and P+1 and new-token columns 1
        # and 2 get junk, each overwritten by its own step before anything reads it.
        with torch.no_grad():
            self.step = Captured(self._step, graphs)

    def forward(self, ids_BT: Tensor, pos_T: Tensor) -> Tensor:
        """T tokens of every row at positions ``pos_T``: the greedy token after the last [B]."""
        body = self.model.model
        self.cache.where = pos_T
        x_BTD: Tensor = body.embed_tokens(ids_BT)
        rope = rope_cos_sin(pos_T[None], body.inv_freq, x_BTD.dtype)
        seen_TK = self.slot_ids[None, :] <= pos_T[:, None]
        for i, layer in enumerate(body.layers):
            x_BTD = layer(x_BTD, rope, seen_TK, self.cache, i)
        logits_B1V: Tensor = self.model.lm_head(body.norm(x_BTD[:, -1:]))
        return logits_B1V[:, 0].float().argmax(dim=-1)

    def _step(self) -> tuple[Tensor, ...]:
        next_B = self.forward(self.ids_B1, self.pos[None])
        self.out_BN.index_copy_(1, (self.pos - self.prompt_len + 1)[None], next_B[:, None])
        self.ids_B1.copy_(next_B[:, None])
        self.pos.add_(1)
        return ()

    @torch.no_grad()
    def generate(self, prompts_BP: Tensor, on_settled: Callable[[], None] | None = None
                 ) -> list[list[int]]:
        """Each row's ``max_new`` greedy tokens. ``on_settled`` is called once the prefill
        is dispatched: from then on the loop only replays its recording, which allocates
        no device memory and records nothing."""
        if tuple(prompts_BP.shape) != (self.out_BN.shape[0], self.prompt_len):
            raise ValueError(f"expected prompts of shape {(self.out_BN.shape[0], self.prompt_len)}"
                             f", got {tuple(prompts_BP.shape)}")
        first_B = self.forward(prompts_BP, torch.arange(self.prompt_len,
                                                        device=prompts_BP.device))
        self.out_BN[:, 0] = first_B
        self.ids_B1.copy_(first_B[:, None])
        self.pos.fill_(self.prompt_len)
        if on_settled is not None:
            on_settled()
        for _ in range(self.max_new - 1):
            self.step.run()
        rows: list[list[int]] = self.out_BN.tolist()
        return rows
