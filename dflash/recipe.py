"""The training recipe as one typed config, the named presets, and ``--set key=value``.

Defaults are the paper's recipe (AdamW lr 6e-4, clip 1.0, cosine with 4 % warm-up,
512 anchors, B=16, gamma=7, 5 draft layers, S=3072); presets are plain functions that
return a TrainConfig.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(kw_only=True, slots=True)
class TrainConfig:
    # What to train on.
    target: str = "qwen3-8b-shape"
    """A local HF model folder or config, or a named shape (dflash.target.TARGET_SHAPES)."""
    data: str | None = None
    """Training JSONL; None generates data with the target itself (synthetic prompts)."""
    layer_ids: tuple[int, ...] | None = None
    """Tapped target layers; None uses the formula (or the tiny shape's own ids)."""
    mask_token_id: int | None = None
    """None: the target's (tokenizer mask token, else a spare embedding row)."""
    # The drafter.
    draft_layers: int = 5
    block_size: int = 16
    gamma: float = 7.0
    # Batches: every batch is [batch_size, one of buckets], so compile sees fixed shapes.
    batch_size: int = 1
    buckets: tuple[int, ...] = (3072,)
    anchors: int = 512
    # Optimisation.
    steps: int = 1000
    stop_after: int = 0
    """Stop (checkpoint, no export) once this many steps are done, as SIGTERM does; the
    schedule still runs to ``steps``. For time-sliced jobs; 0 = never."""
    lr: float = 6e-4
    warmup_ratio: float = 0.04
    min_lr_ratio: float = 0.0
    weight_decay: float = 0.0
    beta1: float = 0.9
    beta2: float = 0.999
    grad_clip: float = 1.0
    loss_chunk: int = 4096
    # Where and how.
    device: str = "auto"
    """auto: cuda when available, else cpu."""
    dtype: str = "auto"
    """Compute dtype; auto: bfloat16 on GPU (fp32 master weights), float32 on CPU."""
    attention: str = "auto"
    """flex | sdpa | auto (flex on GPU; sdpa on CPU, where flex has no backward)."""
    compile: str = "auto"
    """on | off | auto (on for GPU). Compiles the one flex_attention handle and the
    block-mask builder, on the main thread, in a warm-up step per shape."""
    seed: int = 0
    mega_cache: str = "auto"
    """torch Mega-Cache of the compiled kernels: auto (envguard's cache dir, keyed by the
    compile-compat key), off, or a folder. Loaded before the warm-up when one matches."""
    # Synthetic data (when data is None).
    synthetic_prompts: int = 512
    synthetic_prompt_length: int = 16
    synthetic_response_tokens: int = 96
    held_out: int = 16
    """Examples kept aside for the held-out tau estimate."""
    # Bookkeeping.
    out: str = "runs/dflash"
    log_every: int = 10
    eval_every: int = 100
    save_every: int = 200
    keep_checkpoints: int = 2
    peak_tflops: float | None = None
    """MFU denominator; None measures the dense matmul rate at start."""

    def __post_init__(self) -> None:
        checks: list[tuple[bool, str]] = [
            (self.block_size >= 2, "block_size must be >= 2"),
            (self.batch_size >= 1, "batch_size must be >= 1"),
            (self.anchors >= 1, "anchors must be >= 1"),
            (self.steps >= 0, "steps must be >= 0"),
            (self.draft_layers >= 1, "draft_layers must be >= 1"),
            (bool(self.buckets) and all(b > self.block_size for b in self.buckets),
             "buckets must be non-empty and longer than block_size"),
            (list(self.buckets) == sorted(set(self.buckets)), "buckets must be increasing"),
            (self.lr > 0 and self.gamma > 0, "lr and gamma must be > 0"),
            (0 <= self.warmup_ratio < 1, "warmup_ratio must be in [0, 1)"),
            (self.attention in ("auto", "flex", "sdpa"), "attention must be auto|flex|sdpa"),
            (self.compile in ("auto", "on", "off"), "compile must be auto|on|off"),
            (self.dtype in ("auto", "bfloat16", "float32"), "dtype must be auto|bfloat16|float32"),
            (self.log_every >= 1 and self.save_every >= 0 and self.eval_every >= 0,
             "log_every must be >= 1, save_every and eval_every >= 0"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        return {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}


def tiny() -> TrainConfig:
    """CPU, about a minute: a random 8-layer H=64 Qwen3-shaped target, data generated
    greedily by that target, a 2-layer drafter with B=4."""
    return TrainConfig(
        target="tiny", draft_layers=2, block_size=4, gamma=4.0, batch_size=8,
        buckets=(128,), anchors=24, steps=240, lr=3e-3, synthetic_prompts=1024,
        synthetic_prompt_length=12, synthetic_response_tokens=96, held_out=16,
        log_every=20, eval_every=80, save_every=120, loss_chunk=1024)


def qwen3_1_7b_shape() -> TrainConfig:
    """A Qwen3-1.7B-shaped random target (28 layers, H=2048): how the recipe scales."""
    return TrainConfig(target="qwen3-1.7b-shape", batch_size=1, buckets=(3072,))


def qwen3_8b_shape() -> TrainConfig:
    """The paper's recipe on a Qwen3-8B-shaped random target (36 layers, H=4096)."""
    return TrainConfig(target="qwen3-8b-shape", batch_size=1, buckets=(3072,))


PRESETS: dict[str, Callable[[], TrainConfig]] = {
    "tiny": tiny, "qwen3-1.7b-shape": qwen3_1_7b_shape, "qwen3-8b-shape": qwen3_8b_shape}


def _convert(raw: str, annotation: Any, key: str) -> Any:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (types.UnionType, typing.Union):
        if raw.lower() in ("none", "null", "") and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return _convert(raw, inner, key)
    if origin is tuple:
        return tuple(int(x) for x in raw.replace(" ", "").split(",") if x)
    if annotation is bool:
        if raw.lower() not in ("1", "0", "true", "false", "yes", "no"):
            raise ValueError(f"{key}: expected true or false, got {raw!r}")
        return raw.lower() in ("1", "true", "yes")
    if annotation is int:
        return int(raw)
    if annotation is float:
        return float(raw)
    return raw


def apply_overrides(cfg: TrainConfig, pairs: list[str]) -> TrainConfig:
    """``--set key=value`` overrides, type-checked against the field; returns a new config."""
    hints = typing.get_type_hints(TrainConfig)
    changes: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        key = key.strip().replace("-", "_")
        if not sep:
            raise ValueError(f"--set expects key=value, got {pair!r}")
        if key not in hints:
            raise ValueError(f"--set: unknown key {key!r} (known: {', '.join(sorted(hints))})")
        try:
            changes[key] = _convert(raw.strip(), hints[key], key)
        except ValueError as exc:
            raise ValueError(f"--set {key}: cannot read {raw!r}: {exc}") from None
    return dataclasses.replace(cfg, **changes)
