"""The configs, as typed dataclasses: the drafter's architecture, a random target's shape,
and the training recipe. Plain Python (no torch), so every command checks them before
it imports torch; the named instances are in :mod:`dflash.presets`.

The recipe's defaults are the paper's (AdamW lr 6e-4, clip 1.0, cosine with 4 % warm-up,
512 anchors, B=16, gamma=7, 5 draft layers, S=3072).
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass
from typing import Any

from dflash.decoding.choices import CYCLE_PATHS
from dflash.errors import ConfigError


def target_layer_ids_for(num_target_layers: int, k: int) -> list[int]:
    """Which target decoder layers to tap: k ids spread from layer 1 to layer L-3.

    Same formula as z-lab's ``build_target_layer_ids``: k == 1 gives L//2, otherwise
    round(1 + i*(L-4)/(k-1)). Id i is the *output* of decoder layer i, i.e. HF
    ``hidden_states[i + 1]``. Small L gives duplicates (L=6, k=5), which we refuse.
    """
    if num_target_layers < 1:
        raise ConfigError(f"num_target_layers must be >= 1, got {num_target_layers}")
    if k < 1:
        raise ConfigError(f"k must be >= 1, got {k}")
    if k == 1:
        return [num_target_layers // 2]
    ids = [round(1 + i * (num_target_layers - 4) / (k - 1)) for i in range(k)]
    if len(set(ids)) != k or min(ids) < 0 or max(ids) >= num_target_layers:
        raise ConfigError(
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
                raise ConfigError(f"{name} must be a positive int, got {value!r}")
        for name in ("rope_theta", "rms_eps", "gamma"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"{name} must be > 0, got {getattr(self, name)!r}")
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(f"num_kv_heads ({self.num_kv_heads}) must divide "
                             f"num_heads ({self.num_heads})")
        if self.head_dim % 2:
            raise ConfigError(f"head_dim must be even for RoPE, got {self.head_dim}")
        if self.block_size < 2:
            # Slot 0 is never trained, so B=1 has nothing to learn.
            raise ConfigError(f"block_size must be >= 2, got {self.block_size}")
        if not 0 <= self.mask_token_id < self.vocab_size:
            raise ConfigError(f"mask_token_id must be in [0, vocab_size={self.vocab_size}), "
                             f"got {self.mask_token_id}")
        ids = self.target_layer_ids
        if not ids:
            raise ConfigError("target_layer_ids must not be empty")
        if list(ids) != sorted(set(ids)):
            raise ConfigError(f"target_layer_ids must be strictly increasing, got {list(ids)}")
        if ids[0] < 0 or ids[-1] >= self.num_target_layers:
            raise ConfigError(f"target_layer_ids must lie in [0, num_target_layers="
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
            raise ConfigError(f"unknown DrafterConfig fields: {unknown}")
        return cls(**d)


@dataclass(frozen=True, slots=True)
class TargetShape:
    """A Qwen3 architecture with random weights, for tests and benchmarks."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float
    tie_embeddings: bool
    mask_token_id: int
    layer_ids: tuple[int, ...] | None = None
    """None: the DFlash formula for k evenly spaced taps."""


@dataclass(kw_only=True, slots=True)
class TrainConfig:
    """The whole training recipe; ``--set key=value`` changes any field."""

    # What to train on.
    target: str = "qwen3-8b-shape"
    """A local HF model folder or config, or a named shape (dflash.presets.TARGET_SHAPES)."""
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
    max_seconds: float = 0.0
    """Finish once this many seconds have passed on the training loop's clock (from its
    first step; held-out evaluations count, the start-up does not), as at ``steps``: a last
    held-out evaluation, a checkpoint and the export. The schedule still runs to
    ``steps``. For a run with a wall-clock budget; 0 = none."""
    lr: float = 6e-4
    warmup_ratio: float = 0.04
    min_lr_ratio: float = 0.0
    weight_decay: float = 0.0
    beta1: float = 0.9
    beta2: float = 0.999
    grad_clip: float = 1.0
    optimizer_kernel: str = "auto"
    """auto | off. auto: with bf16 parameters on a GPU with Triton, each tensor's clip,
    AdamW step and bf16 copy are one Triton pass (dflash/adamw_kernel.py); off: torch
    operators everywhere (the same update; the state and checkpoints are the same)."""
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
    """Examples kept aside for the held-out tau estimate: whole sources (a row's
    ``source`` or ``prompt_id``, else its prompt), never one that also trains."""
    held_out_decode_prompts: int = 4
    """At each evaluation, also decode this many held-out prompts with the current
    drafter against the target (greedy speculative decoding): ``held_out_decode_tau``
    next to the teacher-forced ``held_out_tau``. 0: not measured."""
    held_out_decode_tokens: int = 32
    """New tokens per decoded prompt."""
    held_out_decode_cycle: str = "auto"
    """How that decode runs its cycles, as ``dflash-eval --cycle``: eager | static | auto
    (static where the target is dflash's own Qwen3 on a GPU, else eager). ``static``
    (fixed shapes, captured in CUDA graphs on a GPU) decodes the same tokens at a fraction
    of an eager cycle's launches; the tokens and τ are the same either way."""
    held_out_window: int = 0
    """Tokens after each held-out prompt that ``held_out_tau`` walks (decoding replayed
    teacher forced, :mod:`dflash.replay`); 0: ``held_out_decode_tokens``. Set it to
    ``dflash-eval``'s ``--max-new-tokens`` to predict what that decodes."""
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
            (self.optimizer_kernel in ("auto", "off"), "optimizer_kernel must be auto|off"),
            (self.max_seconds >= 0, "max_seconds must be >= 0"),
            (self.held_out_decode_cycle in CYCLE_PATHS,
             f"held_out_decode_cycle must be one of {', '.join(CYCLE_PATHS)}"),
            (self.log_every >= 1 and self.save_every >= 0 and self.eval_every >= 0,
             "log_every must be >= 1, save_every and eval_every >= 0"),
            (min(self.stop_after, self.held_out, self.keep_checkpoints,
                 self.held_out_decode_prompts, self.held_out_window) >= 0
             and self.loss_chunk >= 1 and self.held_out_decode_tokens >= 1,
             "stop_after, held_out, keep_checkpoints, held_out_decode_prompts and "
             "held_out_window must be >= 0, loss_chunk and held_out_decode_tokens >= 1"),
            (self.data is not None or min(self.synthetic_prompts, self.synthetic_prompt_length,
                                          self.synthetic_response_tokens) >= 1,
             "synthetic_prompts, synthetic_prompt_length and synthetic_response_tokens "
             "must be >= 1"),
        ]
        for ok, message in checks:
            if not ok:
                raise ConfigError(message)
        for f in dataclasses.fields(self):  # a NaN passes every comparison's negation
            value = getattr(self, f.name)
            if isinstance(value, float) and not math.isfinite(value):
                raise ConfigError(f"{f.name} must be a finite number, got {value}")
        check_device(self.device)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        return {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}


DEVICE_TYPES = ("cpu", "cuda", "mps", "xpu")


def check_device(name: str, what: str = "device") -> None:
    """``auto``, or a device type torch knows with an optional index (cpu, cuda, cuda:N)."""
    match = re.fullmatch(r"([a-z]+)(:\d+)?", name)
    if name != "auto" and (match is None or match.group(1) not in DEVICE_TYPES):
        raise ConfigError(f"{what} must be auto, cpu, cuda or cuda:N, got {name!r}")


def kernels_for(cfg: TrainConfig, *, gpu: bool) -> tuple[str, bool]:
    """(attention, compile on) for ``cfg`` on a machine with or without a GPU."""
    attention = cfg.attention if cfg.attention != "auto" else ("flex" if gpu else "sdpa")
    compile_on = cfg.compile == "on" or (cfg.compile == "auto" and gpu)
    if attention == "flex" and not gpu:
        raise ConfigError("flex_attention has no backward on CPU: use attention=sdpa there")
    if compile_on and attention != "flex":
        raise ConfigError("compile=on compiles the flex_attention path: use attention=flex")
    return attention, compile_on
