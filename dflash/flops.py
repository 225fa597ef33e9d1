"""What a training step costs: the FLOP count behind MFU (measured in :mod:`dflash.meter`).

FLOPs follow docs/DFLASH.md, "FLOP counting and MFU" (model FLOPs: activation
recomputation is not counted, the frozen target's forward is):

* target forward, only the layers that run: 2 * P_used per context token;
* fc (its input needs no grad): 4 * (k*H*H) per context token;
* context K/V projections: 6 * L_d * (2 * H * h_kv * d) per context token;
* draft layers on the block tokens: 6 * P_layer * L_d per draft token;
* frozen lm_head (forward and input-grad): 4 * H * V per draft token;
* attention: forward 4 * h * d * L_d per visible (query, key) pair, backward twice that.
"""

from __future__ import annotations

from dataclasses import dataclass

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
