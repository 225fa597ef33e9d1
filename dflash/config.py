"""The drafter's architecture config, its validation, and named presets.

Training/data configs land with the training loop; this file only describes the model.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


def target_layer_ids_for(num_target_layers: int, k: int) -> list[int]:
    """Which target decoder layers to tap: k ids spread from layer 1 to layer L-3.

    Same formula as z-lab's ``build_target_layer_ids``: k == 1 gives L//2, otherwise
    round(1 + i*(L-4)/(k-1)). Id i is the *output* of decoder layer i, i.e. HF
    ``hidden_states[i + 1]``. Small L gives duplicates (L=6, k=5), which we refuse.
    """
    if num_target_layers < 1:
        raise ValueError(f"num_target_layers must be >= 1, got {num_target_layers}")
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if k == 1:
        return [num_target_layers // 2]
    ids = [round(1 + i * (num_target_layers - 4) / (k - 1)) for i in range(k)]
    if len(set(ids)) != k or min(ids) < 0 or max(ids) >= num_target_layers:
        raise ValueError(
            f"target_layer_ids formula gives {ids} for num_target_layers={num_target_layers}, "
            f"k={k}; pass target_layer_ids explicitly")
    return ids


@dataclass(kw_only=True, slots=True)
class DrafterConfig:
    hidden_size: int
    """Must equal the target's: the drafter reuses the target's embedding and lm_head."""
    intermediate_size: int
    """SwiGLU MLP width."""
    num_layers: int
    """Draft decoder layers (5 in the paper for Qwen3-8B)."""
    num_heads: int
    """Query heads."""
    num_kv_heads: int
    """K/V heads; must divide num_heads (K/V are repeated, not enable_gqa)."""
    head_dim: int
    """Per-head width; even, because RoPE rotates pairs."""
    rope_theta: float
    """RoPE base; keep equal to the target's so exported checkpoints match."""
    rms_eps: float
    """RMSNorm epsilon."""
    block_size: int
    """B: tokens per draft block, [anchor, MASK*(B-1)]."""
    mask_token_id: int
    """An existing (frozen) row of the target embedding used for MASK slots."""
    target_layer_ids: tuple[int, ...]
    """Tapped target layers, increasing; id i = HF hidden_states[i+1]."""
    num_target_layers: int
    """Target decoder layer count (z-lab config.json carries it; bounds target_layer_ids)."""
    vocab_size: int
    """Rows of the target's embedding / lm_head."""
    gamma: float = 7.0
    """Loss decay constant: w_k = exp(-(k-1)/gamma). 7 for B=16, 5 for B=10, 4 for B=8."""

    def __post_init__(self) -> None:
        self.target_layer_ids = tuple(self.target_layer_ids)
        for name in ("hidden_size", "intermediate_size", "num_layers", "num_heads",
                     "num_kv_heads", "head_dim", "num_target_layers", "vocab_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        for name in ("rope_theta", "rms_eps", "gamma"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)!r}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_kv_heads ({self.num_kv_heads}) must divide "
                             f"num_heads ({self.num_heads})")
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for RoPE, got {self.head_dim}")
        if self.block_size < 2:
            # Slot 0 is never trained, so B=1 has nothing to learn.
            raise ValueError(f"block_size must be >= 2, got {self.block_size}")
        if not 0 <= self.mask_token_id < self.vocab_size:
            raise ValueError(f"mask_token_id must be in [0, vocab_size={self.vocab_size}), "
                             f"got {self.mask_token_id}")
        ids = self.target_layer_ids
        if not ids:
            raise ValueError("target_layer_ids must not be empty")
        if list(ids) != sorted(set(ids)):
            raise ValueError(f"target_layer_ids must be strictly increasing, got {list(ids)}")
        if ids[0] < 0 or ids[-1] >= self.num_target_layers:
            raise ValueError(f"target_layer_ids must lie in [0, num_target_layers="
                             f"{self.num_target_layers}), got {list(ids)}")

    @property
    def num_features(self) -> int:
        """k: how many target hidden states are concatenated into fc's input."""
        return len(self.target_layer_ids)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["target_layer_ids"] = list(self.target_layer_ids)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> DrafterConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown DrafterConfig fields: {unknown}")
        return cls(**d)


def tiny() -> DrafterConfig:
    """CPU-sized: for an 8-layer, H=64, vocab-512 test target."""
    return DrafterConfig(
        hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4, num_kv_heads=2,
        head_dim=16, rope_theta=10_000.0, rms_eps=1e-6, block_size=4, mask_token_id=511,
        target_layer_ids=(1, 3, 5), num_target_layers=8, vocab_size=512, gamma=4.0)


def qwen3_8b() -> DrafterConfig:
    """The paper's Qwen3-8B drafter (SpecForge configs/qwen3-8b-dflash.json)."""
    return DrafterConfig(
        hidden_size=4096, intermediate_size=12288, num_layers=5, num_heads=32, num_kv_heads=8,
        head_dim=128, rope_theta=1_000_000.0, rms_eps=1e-6, block_size=16,
        mask_token_id=151669, target_layer_ids=tuple(target_layer_ids_for(36, 5)),
        num_target_layers=36, vocab_size=151936, gamma=7.0)


PRESETS: dict[str, Callable[[], DrafterConfig]] = {f.__name__: f for f in (tiny, qwen3_8b)}
