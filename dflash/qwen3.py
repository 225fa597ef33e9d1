"""A Qwen3 causal LM of dflash's own: the target without transformers on the start path.

Importing transformers' Qwen3 classes takes about 5 s on the H200 host (its modeling
utilities pull in dynamo and the distributed tensor code), more than the rest of a warm
trainer start before the first step. This module is the same network in plain PyTorch:
the same parameter names (a transformers Qwen3 checkpoint loads into it unchanged and the
named shapes draw the same random weights), the same numerics (RMSNorm in fp32, RoPE
computed in fp32, ``scaled_dot_product_attention``) and the interface the target wrapper
uses (``get_decoder``, ``get_input_embeddings``, ``past_key_values``, ``logits_to_keep``); its
K/V live in the drafter's :class:`~dflash.model.KVCache`.

Reads top to bottom: config, attention, layer, model, loading. Architectures it
does not cover (another ``model_type``, attention biases, sliding windows, scaled RoPE)
are left to transformers by :func:`config_from_json` returning None.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dflash import reading
from dflash.errors import TargetError
from dflash.model import MLP, KVCache, RMSNorm, apply_rope, rope_cos_sin


@dataclass(frozen=True, kw_only=True, slots=True)
class Qwen3Config:
    """The fields of a transformers ``Qwen3Config`` this network reads, by the same names
    (the target wrapper and the drafter's config read them off either)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rope_theta: float
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 40960
    model_type: str = "qwen3"

    def to_json(self) -> dict[str, Any]:
        """A ``config.json`` transformers reads as the same Qwen3."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        return {**out, "architectures": ["Qwen3ForCausalLM"], "attention_bias": False,
                "use_sliding_window": False, "rope_scaling": None}


def config_from_json(raw: Any) -> Qwen3Config | None:
    """The config of a ``config.json`` this module runs exactly, else None (transformers
    builds it). A Qwen3 config missing a required field is a :class:`TargetError`."""
    if not isinstance(raw, dict) or raw.get("model_type") != "qwen3":
        return None
    rope = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
    if not isinstance(rope, dict) or rope.get("rope_type", rope.get("type", "default")) not in (
            "default", None):
        return None
    if raw.get("attention_bias") or raw.get("use_sliding_window"):
        return None
    if any(t != "full_attention" for t in raw.get("layer_types") or ()):
        return None
    theta: Any = raw.get("rope_theta", rope.get("rope_theta", 10_000.0))
    try:
        heads = int(raw["num_attention_heads"])
        return Qwen3Config(
            vocab_size=int(raw["vocab_size"]), hidden_size=int(raw["hidden_size"]),
            intermediate_size=int(raw["intermediate_size"]),
            num_hidden_layers=int(raw["num_hidden_layers"]), num_attention_heads=heads,
            num_key_value_heads=int(raw.get("num_key_value_heads") or heads),
            head_dim=int(raw.get("head_dim") or int(raw["hidden_size"]) // heads),
            rope_theta=float(theta), rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            max_position_embeddings=int(raw.get("max_position_embeddings", 40960)))
    except (KeyError, TypeError, ValueError) as exc:
        raise TargetError(f"Qwen3 config: bad or missing field: {exc}") from None


CAUSAL = "causal"
"""The attention of a forward whose queries are all its keys (no cache before them)."""
Visibility = Tensor | str | None
"""What the T new queries see of the K keys: None (T = 1: everything), :data:`CAUSAL`,
a boolean [T, K] mask (T new positions on top of a cache), or a [B, 1, T, K] one (a
left-padded batch: :func:`visibility`). Built once a forward."""


def visibility(t: int, k_len: int, device: torch.device, keys_BK: Tensor | None = None
               ) -> Visibility:
    """Query t (the last T of K positions) sees keys 0..K-T+t. ``keys_BK`` (left-padded
    batches): which of the K positions of each row hold tokens; the mask is then [B, 1, T, K],
    and a padding query sees itself, so that no row of the softmax is empty (an empty one
    gives NaN, which masked keys would still carry into the real rows: 0 x NaN)."""
    if keys_BK is None:
        if t == 1:
            return None
        if t == k_len:
            return CAUSAL
    rows = torch.arange(k_len - t, k_len, device=device)[:, None]
    cols = torch.arange(k_len, device=device)[None, :]
    causal_TK = cols <= rows
    if keys_BK is None:
        return causal_TK
    return ((causal_TK[None] & keys_BK[:, None, :].bool()) | (cols == rows)[None])[:, None]


def causal_attention(q_BHTd: Tensor, k_BGKd: Tensor, v_BGKd: Tensor, seen: Visibility
                     ) -> Tensor:
    """Grouped-query attention. On top of a cache (decoding, a verify), the ``rep`` query
    heads that share a K/V head become ``rep`` times as many query rows of that head, each
    row seeing what its query sees: the same sums, and no copy of the cache. Repeating
    K/V for every head instead (transformers' SDPA path) copied the whole cache each
    forward: 2.4 s of the 5.3 s the 8B-shaped target took to generate its 512 x 96 training
    tokens on an H100. A causal forward with no cache (a prefill) repeats K/V: its mask is
    the kernel's own, and it runs once."""
    bsz, heads, t, d = q_BHTd.shape
    rep = heads // k_BGKd.shape[1]
    if rep > 1 and not isinstance(seen, str):
        q_BGRd = q_BHTd.reshape(bsz, k_BGKd.shape[1], rep * t, d)  # rows: (head in group, t)
        mask = None if seen is None else (seen.repeat(rep, 1) if seen.dim() == 2
                                          else seen.repeat(1, 1, rep, 1))
        out = F.scaled_dot_product_attention(q_BGRd, k_BGKd, v_BGKd, attn_mask=mask)
        return out.reshape(bsz, heads, t, d)
    if rep > 1:
        k_BGKd, v_BGKd = k_BGKd.repeat_interleave(rep, 1), v_BGKd.repeat_interleave(rep, 1)
    if seen is None:
        return F.scaled_dot_product_attention(q_BHTd, k_BGKd, v_BGKd)
    if isinstance(seen, str):
        return F.scaled_dot_product_attention(q_BHTd, k_BGKd, v_BGKd, is_causal=True)
    return F.scaled_dot_product_attention(q_BHTd, k_BGKd, v_BGKd, attn_mask=seen)


class Attention(nn.Module):
    def __init__(self, cfg: Qwen3Config) -> None:
        super().__init__()
        self.n_heads, self.n_kv, self.head_dim = (cfg.num_attention_heads,
                                                  cfg.num_key_value_heads, cfg.head_dim)
        d_model = cfg.hidden_size
        self.q_proj = nn.Linear(d_model, self.n_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(d_model, self.n_kv * self.head_dim, bias=False)
        self.v_proj = nn.Linear(d_model, self.n_kv * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.n_heads * self.head_dim, d_model, bias=False)
        self.q_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)

    def forward(self, x_BTD: Tensor, rope: tuple[Tensor, Tensor], seen: Visibility,
                cache: KVCache | None, layer: int) -> Tensor:
        bsz, t, _ = x_BTD.shape
        q = self.q_norm(self.q_proj(x_BTD).view(bsz, t, self.n_heads, self.head_dim))
        k = self.k_norm(self.k_proj(x_BTD).view(bsz, t, self.n_kv, self.head_dim))
        v_BGTd = self.v_proj(x_BTD).view(bsz, t, self.n_kv, self.head_dim).transpose(1, 2)
        q_BHTd, k_BGTd = apply_rope(q.transpose(1, 2), *rope), apply_rope(k.transpose(1, 2), *rope)
        if cache is not None:
            k_BGTd, v_BGTd = cache.update(layer, k_BGTd, v_BGTd)
        out_BHTd = causal_attention(q_BHTd, k_BGTd, v_BGTd, seen)
        out: Tensor = self.o_proj(out_BHTd.transpose(1, 2).reshape(bsz, t, -1))
        return out


class DecoderLayer(nn.Module):
    def __init__(self, cfg: Qwen3Config) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg.hidden_size, cfg.intermediate_size)

    def forward(self, x_BTD: Tensor, rope: tuple[Tensor, Tensor], seen: Visibility,
                cache: KVCache | None, layer: int) -> Tensor:
        x_BTD = x_BTD + self.self_attn(self.input_layernorm(x_BTD), rope, seen, cache, layer)
        out: Tensor = x_BTD + self.mlp(self.post_attention_layernorm(x_BTD))
        return out


class Qwen3Model(nn.Module):
    inv_freq: Tensor

    def __init__(self, cfg: Qwen3Config) -> None:
        super().__init__()
        self.config = cfg
        # The initial values are drawn only off the meta device: on meta, nn.Embedding's
        # normal_ goes through a Python decomposition that imports dynamo (seconds).
        weight = torch.empty(cfg.vocab_size, cfg.hidden_size)
        if weight.device.type != "meta":
            nn.init.normal_(weight)
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size, _weight=weight)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        freq = torch.empty(cfg.head_dim // 2)  # arange on meta would import dynamo too
        self.register_buffer("inv_freq", freq if freq.device.type == "meta"
                             else inv_freq(cfg, freq.device), persistent=False)

    def forward(self, input_ids_BT: Tensor, position_ids_BT: Tensor, cache: KVCache | None,
                keys_BK: Tensor | None = None) -> Tensor:
        x_BTD: Tensor = self.embed_tokens(input_ids_BT)
        rope = rope_cos_sin(position_ids_BT, self.inv_freq, x_BTD.dtype)
        t = input_ids_BT.shape[1]
        seen = visibility(t, t + (0 if cache is None else cache.length), x_BTD.device, keys_BK)
        for i, layer in enumerate(self.layers):
            x_BTD = layer(x_BTD, rope, seen, cache, i)
        out: Tensor = self.norm(x_BTD)
        return out


def inv_freq(cfg: Qwen3Config, device: torch.device | str | None = None) -> Tensor:
    exponent = torch.arange(0, cfg.head_dim, 2, dtype=torch.float32, device=device)
    return 1.0 / (cfg.rope_theta ** (exponent / cfg.head_dim))


@dataclass(frozen=True, slots=True)
class CausalLMOutput:
    logits: Tensor
    """[B, T, V] in the model's dtype (the last ``logits_to_keep`` positions when given)."""


class Qwen3ForCausalLM(nn.Module):
    """``model.*`` and ``lm_head.weight``, as in a transformers Qwen3 checkpoint."""

    def __init__(self, cfg: Qwen3Config) -> None:
        super().__init__()
        self.config = cfg
        self.model = Qwen3Model(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.tie_weights()

    def tie_weights(self) -> None:
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def get_decoder(self) -> Qwen3Model:
        return self.model

    def get_input_embeddings(self) -> nn.Embedding:
        return self.model.embed_tokens

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head

    def new_cache(self) -> KVCache:
        return KVCache(self.config.num_hidden_layers)

    def reset_rope(self) -> None:
        """Recompute the RoPE frequencies (a non-persistent buffer: meta after a meta
        build, garbage after ``to_empty``)."""
        device = self.model.embed_tokens.weight.device
        self.model.inv_freq = inv_freq(self.config, device)

    def save_pretrained(self, folder: str | Path) -> None:
        """``config.json`` and ``model.safetensors`` as transformers writes a Qwen3 (it and
        :func:`load_folder` read them back); the tied head is stored once."""
        from safetensors.torch import save_file

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        state = {name: t.detach().contiguous() for name, t in self.state_dict().items()
                 if not (self.config.tie_word_embeddings and name == "lm_head.weight")}
        save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
        raw = {**self.config.to_json(),
               "dtype": str(self.model.embed_tokens.weight.dtype).removeprefix("torch.")}
        (folder / "config.json").write_text(json.dumps(raw, indent=2) + "\n", encoding="utf-8")

    def forward(self, input_ids: Tensor, position_ids: Tensor | None = None,
                past_key_values: KVCache | None = None, use_cache: bool = False,
                logits_to_keep: int = 0, attention_mask: Tensor | None = None
                ) -> CausalLMOutput:
        """transformers' arguments; ``attention_mask`` [B, cached + T] is 1 where a position
        holds a token, 0 at a left-padded batch's padding."""
        bsz, t = input_ids.shape
        cache = past_key_values if use_cache else None
        if position_ids is None:
            start = 0 if cache is None else cache.get_seq_length()
            position_ids = torch.arange(start, start + t, device=input_ids.device).expand(bsz, t)
        hidden_BTD = self.model(input_ids, position_ids, cache, attention_mask)
        if logits_to_keep:
            # Contiguous: on a slice of a [B, T, D] batch, F.linear expands the LM head into
            # a batched matmul that reads the whole head once per row (209 ms at the 8B
            # shape for 512 rows, against a plain matmul's few ms).
            hidden_BTD = hidden_BTD[:, -logits_to_keep:].contiguous()
        return CausalLMOutput(logits=self.lm_head(hidden_BTD))


# -- building and loading --------------------------------------------------------------------

def build(cfg: Qwen3Config, dtype: torch.dtype) -> Qwen3ForCausalLM:
    """On the meta device: shapes only, no memory. Allocate it, fill or load the weights,
    then :meth:`Qwen3ForCausalLM.reset_rope` (the frequencies stay fp32)."""
    with torch.device("meta"):
        return Qwen3ForCausalLM(cfg).to(dtype=dtype)


def allocate(model: Qwen3ForCausalLM, device: torch.device) -> None:
    """Give a meta-built model uninitialised storage on ``device``, tied weights kept tied,
    then fp32 RoPE frequencies. (``Module.to_empty`` does the same through a decomposition
    of ``empty_like`` on meta tensors that imports sympy: 2.5 s.)"""
    made: dict[int, nn.Parameter] = {}
    for module in model.modules():
        for name, param in list(module._parameters.items()):
            if param is not None:
                if id(param) not in made:
                    made[id(param)] = nn.Parameter(
                        torch.empty(tuple(param.shape), dtype=param.dtype, device=device),
                        requires_grad=param.requires_grad)
                module._parameters[name] = made[id(param)]
    model.reset_rope()


def _weight_files(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = reading.read_json(index, TargetError, "weight index")["weight_map"]
            return sorted({folder / name for name in weight_map.values()})
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise TargetError(f"{index}: not a usable weight index: {exc}") from None
    return sorted(folder.glob("*.safetensors"))


def load_folder(folder: Path, cfg: Qwen3Config, *, device: torch.device,
                dtype: torch.dtype) -> Qwen3ForCausalLM:
    """A transformers Qwen3 checkpoint's safetensors, read straight into a meta-built
    model on ``device`` (no second copy in host memory beyond the mapped file)."""
    from safetensors import SafetensorError, safe_open

    model = build(cfg, dtype)
    expected = {name for name, _ in model.named_parameters()}
    seen: set[str] = set()
    state: dict[str, Tensor] = {}
    for path in _weight_files(folder):
        try:
            with safe_open(str(path), framework="pt", device="cpu") as f:
                for name in f.keys():  # noqa: SIM118  (safe_open is not a mapping)
                    if name not in expected and name != "lm_head.weight":
                        raise TargetError(f"{path}: unexpected tensor {name!r} for a Qwen3")
                    tensor = f.get_tensor(name)
                    state[name] = tensor.to(device=device, dtype=dtype, non_blocking=True)
                    seen.add(name)
        except (OSError, SafetensorError) as exc:
            raise TargetError(f"{path}: weights do not read: {exc}") from None
    missing = expected - seen
    if missing:
        raise TargetError(f"{folder}: no tensor for {sorted(missing)[0]!r}"
                          f"{f' (and {len(missing) - 1} more)' if len(missing) > 1 else ''}")
    for name, tensor in state.items():
        if tensor.shape != model.get_parameter(name).shape:
            raise TargetError(f"{folder}: {name} has shape {list(tensor.shape)}, the config "
                              f"says {list(model.get_parameter(name).shape)}")
    if cfg.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    model.load_state_dict(state, strict=False, assign=True)
    model.tie_weights()
    model.reset_rope()
    return model
