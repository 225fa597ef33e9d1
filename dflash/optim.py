"""AdamW on fp32 master weights, and the cosine schedule with linear warm-up.

With bf16 compute the drafter's own parameters are bf16 (so flex_attention sees one
dtype and no per-step casts happen); the optimizer keeps fp32 master copies, steps
them, and copies the result back. With fp32 compute the parameters are the masters.
"""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

Update = Callable[..., None]
"""A one-tensor update: :func:`update_reference_`'s arguments."""


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
    """AdamW whose state is torch's (``self.adamw``: what checkpoints save and load) over
    fp32 masters. With fp32 parameters torch's AdamW steps them. With bf16 parameters
    each step is one pass a tensor (:mod:`dflash.adamw_kernel` on CUDA,
    :func:`update_reference_` elsewhere) on the same state tensors torch's fused AdamW
    keeps, so a checkpoint resumes on either path."""

    def __init__(self, model: nn.Module, *, lr: float, betas: tuple[float, float],
                 weight_decay: float, eps: float = 1e-8, kernel: bool = True) -> None:
        self.names = [n for n, p in model.named_parameters() if p.requires_grad]
        self.params: list[Tensor] = [p for p in model.parameters() if p.requires_grad]
        self.mixed = any(p.dtype != torch.float32 for p in self.params)
        if self.mixed:
            self.master: list[Tensor] = [p.detach().float().clone() for p in self.params]
        else:
            self.master = self.params
        fused = all(p.is_cuda for p in self.params)
        self.adamw = torch.optim.AdamW(self.master, lr=lr, betas=betas, eps=eps,
                                       weight_decay=weight_decay, fused=fused or None)
        """torch's AdamW over the master weights (what DCP saves under torchrun)."""
        self.kernel: Update | None = (_kernel_for([_local(p) for p in self.params])
                                      if kernel and self.mixed else None)
        """:func:`dflash.adamw_kernel.adamw_update_` where the bf16 steps can run it."""
        self._steps: int | None = None

    @torch.no_grad()
    def step(self, lr: float, clip: float) -> Tensor:
        """Clip, step, copy back, clear gradients. Returns the pre-clip grad norm
        (a device tensor: nothing here waits for the GPU)."""
        if self.mixed:
            return self._mixed_step(lr, clip)
        grads = [m for m in self.master if m.grad is not None]
        norm = torch.nn.utils.clip_grad_norm_(grads, clip, foreach=True)
        for group in self.adamw.param_groups:
            group["lr"] = lr
        self.adamw.step()
        for p in self.params:
            p.grad = None
        return norm

    def _mixed_step(self, lr: float, clip: float) -> Tensor:
        grads = [_local(p.grad) if p.grad is not None else torch.zeros_like(_local(p))
                 for p in self.params]
        if self.kernel is None:  # the reference path's norm is clip_grad_norm_'s exactly
            grads = [g.float() for g in grads]
        norms = torch._foreach_norm(grads, 2, dtype=torch.float32)
        norm: Tensor = torch.linalg.vector_norm(torch.stack(norms))
        mesh = getattr(self.params[0], "device_mesh", None)
        if mesh is not None:  # FSDP2: each rank holds its own shards of every parameter
            square = norm * norm
            dist.all_reduce(square, group=mesh.get_group())
            norm = square.sqrt()
        coef = (clip / (norm + 1e-6)).clamp(max=1.0)
        group = self.adamw.param_groups[0]
        beta1, beta2 = group["betas"]
        step = self._count() + 1
        states = [self._state(m) for m in self.master]
        torch._foreach_add_([s["step"] for s in states], 1.0)
        for g, p, m, s in zip(grads, self.params, self.master, states, strict=True):
            tensors = (g, _local(p), _local(m), _local(s["exp_avg"]), _local(s["exp_avg_sq"]))
            update = (self.kernel if self.kernel is not None
                      and all(t.is_contiguous() for t in tensors) else update_reference_)
            update(*tensors, coef, lr=lr, beta1=beta1, beta2=beta2, eps=group["eps"],
                   weight_decay=group["weight_decay"], step=step)
        self._steps = step
        group["lr"] = lr
        for p in self.params:
            p.grad = None
        return norm

    def _state(self, master: Tensor) -> dict[str, Tensor]:
        """``master``'s state in torch's AdamW, made as its fused path makes it."""
        state: dict[str, Tensor] = self.adamw.state[master]
        if not state:
            state["step"] = torch.zeros((), dtype=torch.float32, device=master.device)
            state["exp_avg"] = torch.zeros_like(master, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(master,
                                                   memory_format=torch.preserve_format)
        return state

    def _count(self) -> int:
        """Steps taken so far: read once from the state (after a resume), then counted
        here, so a step never waits for the device."""
        if self._steps is None:
            state = self.adamw.state.get(self.master[0], {})
            self._steps = int(state["step"].item()) if "step" in state else 0
        return self._steps

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
        self._steps = None


def _kernel_for(params: list[Tensor]) -> Update | None:
    """:func:`dflash.adamw_kernel.adamw_update_` if it can step these (local) parameters:
    every one bf16 on a CUDA device, and Triton installed; else None."""
    if not params or not all(p.is_cuda and p.dtype == torch.bfloat16 for p in params):
        return None
    if importlib.util.find_spec("triton") is None:
        return None
    from dflash.adamw_kernel import adamw_update_

    return adamw_update_


def _local(t: Tensor) -> Tensor:
    """The tensor this rank holds: an FSDP2 shard's local part (a DTensor's: looked up
    by its method, so a launch without FSDP2 never imports DTensor), or ``t`` itself."""
    to_local = getattr(t, "to_local", None)
    return to_local() if to_local is not None else t


def update_reference_(grad: Tensor, param: Tensor, master: Tensor, avg: Tensor,
                      avg_sq: Tensor, coef: Tensor, *, lr: float, beta1: float, beta2: float,
                      eps: float, weight_decay: float, step: int) -> None:
    """:func:`dflash.adamw_kernel.adamw_update_` in torch operators: the clipped gradient,
    then torch's single-tensor AdamW (so on the CPU a step is torch's, bit for bit), the
    master copied into the bf16 ``param``."""
    g = grad.float().mul_(coef)
    master.mul_(1.0 - lr * weight_decay)
    avg.lerp_(g, 1.0 - beta1)
    avg_sq.mul_(beta2).addcmul_(g, g, value=1.0 - beta2)
    denom = (avg_sq.sqrt() / (1.0 - beta2 ** step) ** 0.5).add_(eps)
    master.addcdiv_(avg, denom, value=-lr / (1.0 - beta1 ** step))
    param.copy_(master)
