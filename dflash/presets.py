"""The named instances of the configs: training recipes (``--preset``), random target
shapes (``--target tiny``), drafter architectures, and ``--set key=value`` on a recipe.

Presets are plain functions that return a fresh config. Plain Python (no torch).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dflash.config import DrafterConfig, TargetShape, TrainConfig, target_layer_ids_for
from dflash.errors import ConfigError, TargetError

# -- training recipes ----------------------------------------------------------------------

def tiny() -> TrainConfig:
    """CPU, about a minute: a random 8-layer H=64 Qwen3-shaped target, data generated
    greedily by that target, a 2-layer drafter with B=4."""
    return TrainConfig(
        target="tiny", draft_layers=2, block_size=4, gamma=4.0, batch_size=8,
        buckets=(128,), anchors=24, steps=240, lr=3e-3, synthetic_prompts=1024,
        synthetic_prompt_length=12, synthetic_response_tokens=96, held_out=16,
        log_every=20, eval_every=80, save_every=120, loss_chunk=1024)


def demo() -> TrainConfig:
    """CPU, a few minutes the first time and about a minute and a half after: the tiny
    recipe on a target that is a language model of code (``tiny-stdlib``: the tiny shape
    pretrained on this Python's standard library, built once and cached), 600 steps."""
    return dataclasses.replace(tiny(), target=STDLIB_TARGET, steps=600, eval_every=200,
                               save_every=300)


def qwen3_1_7b_shape() -> TrainConfig:
    """A Qwen3-1.7B-shaped random target (28 layers, H=2048): how the recipe scales."""
    return TrainConfig(target="qwen3-1.7b-shape", batch_size=1, buckets=(3072,))


def qwen3_8b_shape() -> TrainConfig:
    """The paper's recipe on a Qwen3-8B-shaped random target (36 layers, H=4096)."""
    return TrainConfig(target="qwen3-8b-shape", batch_size=1, buckets=(3072,))


PRESETS: dict[str, Callable[[], TrainConfig]] = {
    "tiny": tiny, "demo": demo, "qwen3-1.7b-shape": qwen3_1_7b_shape,
    "qwen3-8b-shape": qwen3_8b_shape}


# -- target shapes -------------------------------------------------------------------------

QWEN3_MASK_ID = 151669  # first row past the Qwen3 tokenizer; the published drafters use it

TARGET_SHAPES: dict[str, TargetShape] = {
    "tiny": TargetShape(vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=8,
                        num_heads=4, num_kv_heads=2, head_dim=16, rope_theta=10_000.0,
                        tie_embeddings=False, mask_token_id=511, layer_ids=(1, 3, 5)),
    "qwen3-1.7b-shape": TargetShape(
        vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_layers=28,
        num_heads=16, num_kv_heads=8, head_dim=128, rope_theta=1_000_000.0,
        tie_embeddings=True, mask_token_id=QWEN3_MASK_ID),
    "qwen3-8b-shape": TargetShape(
        vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_layers=36,
        num_heads=32, num_kv_heads=8, head_dim=128, rope_theta=1_000_000.0,
        tie_embeddings=False, mask_token_id=QWEN3_MASK_ID),
}


STDLIB_TARGET = "tiny-stdlib"
"""The tiny shape pretrained on the standard library (dflash/stdlib_target.py): a named
target with weights, built on first use."""


def target_path(source: str) -> Path | None:
    """None for a named shape (or ``tiny-stdlib``, built on first use), else the local model
    folder or config file ``source`` names; TargetError when it is neither."""
    if source in TARGET_SHAPES or source == STDLIB_TARGET:
        return None
    path = Path(source).expanduser()
    if not path.exists():
        raise TargetError(f"target {source!r} is neither a named shape "
                          f"({', '.join([*TARGET_SHAPES, STDLIB_TARGET])}) nor an existing "
                          "path")
    return path


# -- drafter architectures -----------------------------------------------------------------

def tiny_drafter() -> DrafterConfig:
    """CPU-sized: for an 8-layer, H=64, vocab-512 test target."""
    return DrafterConfig(
        hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4, num_kv_heads=2,
        head_dim=16, rope_theta=10_000.0, rms_eps=1e-6, block_size=4, mask_token_id=511,
        target_layer_ids=(1, 3, 5), num_target_layers=8, vocab_size=512, gamma=4.0)


def qwen3_8b_drafter() -> DrafterConfig:
    """The paper's Qwen3-8B drafter (SpecForge configs/qwen3-8b-dflash.json)."""
    return DrafterConfig(
        hidden_size=4096, intermediate_size=12288, num_layers=5, num_heads=32, num_kv_heads=8,
        head_dim=128, rope_theta=1_000_000.0, rms_eps=1e-6, block_size=16,
        mask_token_id=151669, target_layer_ids=tuple(target_layer_ids_for(36, 5)),
        num_target_layers=36, vocab_size=151936, gamma=7.0)


DRAFTER_PRESETS: dict[str, Callable[[], DrafterConfig]] = {
    "tiny": tiny_drafter, "qwen3-8b": qwen3_8b_drafter}


# -- --set key=value -----------------------------------------------------------------------

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
            raise ConfigError(f"{key}: expected true or false, got {raw!r}")
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
            raise ConfigError(f"--set expects key=value, got {pair!r}")
        if key not in hints:
            raise ConfigError(f"--set: unknown key {key!r} (known: {', '.join(sorted(hints))})")
        try:
            changes[key] = _convert(raw.strip(), hints[key], key)
        except ValueError as exc:
            raise ConfigError(f"--set {key}: cannot read {raw!r}: {exc}") from None
    return dataclasses.replace(cfg, **changes)
