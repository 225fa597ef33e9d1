"""AdamW on fp32 master weights, and the cosine schedule with linear warm-up.

With bf16 compute the drafter's own parameters are bf16 (so flex_attention sees one
dtype and no per-step casts happen); the optimizer keeps fp32 master copies, steps
them, and copies the result back. With fp32 compute the parameters are the masters.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn


def lr_at(step: int, *, base_lr: float, total_steps: int, warmup_ratio: float,
          min_lr_ratio: float = 0.0) -> float:
    """Linear warm-up over ``warmup_ratio * total_steps`` steps, then cosine decay."""
    warmup = max(1, round(warmup_ratio * total_steps))
    if step < warmup:
        return base_lr * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total_steps - warmup))
    cosine = 0.5 * (1.0 + math.cos(math.pi * progress))
    return base_lr * (min_lr_ratio + (1.0 - min_lr_ratio) * cosine)


class MasterAdamW:
    def __init__(self, model: nn.Module, *, lr: float, betas: tuple[float, float],
                 weight_decay: float) -> None:
        self.names = [n for n, p in model.named_parameters() if p.requires_grad]
        self.params: list[Tensor] = [p for p in model.parameters() if p.requires_grad]
        self.mixed = any(p.dtype != torch.float32 for p in self.params)
        if self.mixed:
            self.master: list[Tensor] = [p.detach().float().clone() for p in self.params]
        else:
            self.master = self.params
        fused = all(p.is_cuda for p in self.params)
        self.adamw = torch.optim.AdamW(self.master, lr=lr, betas=betas,
                                       weight_decay=weight_decay, fused=fused or None)
        """torch's AdamW over the master weights (what DCP saves under torchrun)."""

    @torch.no_grad()
    def step(self, lr: float, clip: float) -> Tensor:
        """Clip, step, copy back, clear gradients. Returns the pre-clip grad norm
        (a device tensor: nothing here waits for the GPU)."""
        if self.mixed:
            for m, p in zip(self.master, self.params, strict=True):
                m.grad = p.grad.float() if p.grad is not None else torch.zeros_like(m)
        grads = [m for m in self.master if m.grad is not None]
        norm = torch.nn.utils.clip_grad_norm_(grads, clip, foreach=True)
        for group in self.adamw.param_groups:
            group["lr"] = lr
        self.adamw.step()
        if self.mixed:
            torch._foreach_copy_(self.params, self.master)
        for p in self.params:
            p.grad = None
        if self.mixed:
            for m in self.master:
                m.grad = None
        return norm

    def master_state_dict(self) -> dict[str, Tensor]:
        return dict(zip(self.names, self.master, strict=True))

    @torch.no_grad()
    def load_master(self, weights: dict[str, Tensor]) -> None:
        for name, m, p in zip(self.names, self.master, self.params, strict=True):
            m.copy_(weights[name])
            if self.mixed:
                p.copy_(m)

    def state_dict(self) -> dict[str, Any]:
        return self.adamw.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.adamw.load_state_dict(state)
