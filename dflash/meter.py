"""Step metrics summed on the device between two log points, and turned into one
metrics.jsonl record (reduced over ranks under torchrun) at each log point."""

from __future__ import annotations

import time
from typing import Any

import torch
from torch import Tensor

from dflash.distributed import World, all_reduce_sum
from dflash.loss import LossOutput
from dflash.metrics import finite_or_none
from dflash.optim import lr_at


def _process_start() -> float:
    """When this process started (wall clock): the first record's ``since_start_s`` is
    the time to the first logged step, cold or warm."""
    import psutil

    return float(psutil.Process().create_time())


class Meter:
    """Sums of step metrics on the device between two log points."""

    def __init__(self, block_size: int) -> None:
        self.steps = 0
        self.loss: Tensor | float = 0.0
        self.tau: Tensor | float = 0.0
        self.grad_norm: Tensor | float = 0.0
        self.hits_K: Tensor | float = 0.0
        self.count_K: Tensor | float = 0.0
        self.pairs: Tensor | float = 0.0
        self.ctx_tokens = 0
        self.draft_tokens = 0

    def add(self, out: LossOutput, pairs: Tensor, grad_norm: Tensor, ctx_tokens: int,
            draft_tokens: int) -> None:
        self.steps += 1
        self.loss = self.loss + out.loss.detach()
        self.tau = self.tau + out.tau_sim
        self.grad_norm = self.grad_norm + grad_norm
        self.hits_K = self.hits_K + torch.nan_to_num(out.acc_K) * out.count_K
        self.count_K = self.count_K + out.count_K
        self.pairs = self.pairs + pairs
        self.ctx_tokens += ctx_tokens
        self.draft_tokens += draft_tokens

    def reduce(self, world: World, device: torch.device) -> None:
        """Sum over ranks (a collective at log points only): losses and tau become means
        over ranks, counts and tokens totals."""
        if not world.distributed:
            return
        hits = torch.as_tensor(self.hits_K, device=device).double().reshape(-1)
        counts = torch.as_tensor(self.count_K, device=device).double().reshape(-1)
        k = hits.numel()
        scalars = [torch.as_tensor(v, device=device).double().reshape(1)
                   for v in (self.loss, self.tau, self.pairs)]
        vec = all_reduce_sum(world, torch.cat([*scalars, hits, counts]))
        self.loss, self.tau, self.pairs = vec[0] / world.size, vec[1] / world.size, vec[2]
        self.hits_K, self.count_K = vec[3:3 + k], vec[3 + k:]
        self.ctx_tokens *= world.size
        self.draft_tokens *= world.size

    def record(self, trainer: Any, seconds: float, peak_tflops: float) -> dict[str, Any]:
        self.reduce(trainer.world, trainer.rt.device)
        n = max(1, self.steps)
        acc = (torch.as_tensor(self.hits_K) / torch.as_tensor(self.count_K).clamp_min(1)).tolist()
        flops = trainer.flops.step_flops(self.ctx_tokens, self.draft_tokens,
                                         float(torch.as_tensor(self.pairs).item()))
        record: dict[str, Any] = {
            "step": trainer.step,
            "loss": finite_or_none(float(torch.as_tensor(self.loss).item()) / n),
            "tau_sim": float(torch.as_tensor(self.tau).item()) / n,
            "acc": [round(a, 4) for a in acc[1:]],
            "grad_norm": finite_or_none(float(torch.as_tensor(self.grad_norm).item()) / n),
            "lr": lr_at(trainer.step - 1, base_lr=trainer.cfg.lr, total_steps=trainer.cfg.steps,
                        warmup_ratio=trainer.cfg.warmup_ratio,
                        min_lr_ratio=trainer.cfg.min_lr_ratio),
            "step_s": seconds / n,
            "ctx_tok_s": self.ctx_tokens / seconds,
            "draft_tok_s": self.draft_tokens / seconds,
            "tflops": flops / seconds / 1e12,
            "mfu": flops / seconds / 1e12 / (peak_tflops * trainer.world.device_count),
            "peak_tflops": peak_tflops,
            "since_start_s": time.time() - _process_start(),
        }
        if trainer.rt.device.type == "cuda":
            record["peak_mem_gb"] = torch.cuda.max_memory_allocated(trainer.rt.device) / 2**30
        return record

