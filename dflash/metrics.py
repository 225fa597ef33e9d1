"""What a training step costs and achieves: FLOP counts, the measured matmul ceiling
for MFU, and the metrics.jsonl writer.

FLOPs follow ../shared/reference/dflash.md section 5 (model FLOPs: activation
recomputation is not counted, the frozen target's forward is):

* target forward, only the layers that run: 2 * P_used per context token;
* fc (its input needs no grad): 4 * (k*H*H) per context token;
* context K/V projections: 6 * L_d * (2 * H * h_kv * d) per context token;
* draft layers on the block tokens: 6 * P_layer * L_d per draft token;
* frozen lm_head (forward and input-grad): 4 * H * V per draft token;
* attention: forward 4 * h * d * L_d per visible (query, key) pair, backward twice that.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from dflash.config import DrafterConfig


@dataclass(frozen=True, slots=True)
class FlopModel:
    per_context_token: float
    """Target forward + fc + context K/V, per context position."""
    per_draft_token: float
    """Draft layers + lm_head, per block token (every row runs, padding included)."""
    per_visible_pair: float
    """Attention forward + backward, per visible (query, key) pair."""

    def step_flops(self, context_tokens: float, draft_tokens: float,
                   visible_pairs: float) -> float:
        return (self.per_context_token * context_tokens + self.per_draft_token * draft_tokens
                + self.per_visible_pair * visible_pairs)


def count_params(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def flop_model(cfg: DrafterConfig, target_layer_params: int, draft_layer_params: int
               ) -> FlopModel:
    """``target_layer_params``: parameters of the target layers that run (0..max tap)."""
    hidden, kv_width = cfg.hidden_size, cfg.num_kv_heads * cfg.head_dim
    per_ctx = (2.0 * target_layer_params
               + 4.0 * cfg.num_features * hidden * hidden
               + 6.0 * cfg.num_layers * 2 * hidden * kv_width)
    per_draft = 6.0 * draft_layer_params * cfg.num_layers + 4.0 * hidden * cfg.vocab_size
    per_pair = 3 * 4.0 * cfg.num_heads * cfg.head_dim * cfg.num_layers
    return FlopModel(per_context_token=per_ctx, per_draft_token=per_draft,
                     per_visible_pair=per_pair)


def visible_pairs(anchors_BN: torch.Tensor, keep_BN: torch.Tensor,
                  block_size: int) -> torch.Tensor:
    """(query, key) pairs the DFlash mask lets through: block_size * (anchor + block_size)
    per kept block. Stays on the device (no sync)."""
    return (keep_BN * (anchors_BN + block_size)).sum() * block_size


def sync_device(device: torch.device) -> None:
    """Wait for the device (CUDA) before reading a clock; a no-op on CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure_matmul_tflops(device: torch.device, dtype: torch.dtype, size: int | None = None,
                          seconds: float = 0.5) -> float:
    """The achieved dense matmul rate on this device, the MFU denominator."""
    n = size or (8192 if device.type == "cuda" else 512)
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    for _ in range(3):
        a @ b
    sync_device(device)
    iters, start = 0, time.perf_counter()
    while True:
        for _ in range(10):
            a @ b
        iters += 10
        sync_device(device)
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return 2.0 * n**3 * iters / elapsed / 1e12


class MetricsLog:
    """Appends one JSON object per line to OUT/metrics.jsonl, flushed per record so a
    killed run keeps every line it logged (a resumed run appends)."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._fh = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()

    def write(self, record: dict[str, Any]) -> None:
        self._fh.write(json.dumps(record, allow_nan=False, default=_jsonable) + "\n")
        self._fh.flush()
        os.fsync(self._fh.fileno())

    def close(self) -> None:
        self._fh.close()


def _jsonable(value: object) -> object:
    if isinstance(value, float):
        return None
    raise TypeError(f"not JSON: {type(value).__name__}")


def finite_or_none(x: float) -> float | None:
    return x if x == x and abs(x) != float("inf") else None
