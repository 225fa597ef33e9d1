"""The DFlash drafter: a small stack of Qwen3-style layers with target-KV injection.

Reads top to bottom: RMSNorm, rotary, attention, MLP, layer, KV cache, DFlashDrafter.
The drafter owns no embedding and no lm_head: the caller embeds the block
[anchor, MASK*(B-1)] with the target's frozen embedding and applies the target's
frozen lm_head to the output. No torch.distributed, no torch.compile, no I/O here.

Shape suffixes: B batch, S context length, Q draft-stream length (N*B blocks),
K keys, D hidden, F = k*D fused features, H/G query/KV heads, d head_dim.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dflash.config import DrafterConfig
from dflash.masks import AttendFn


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        # Normalize in fp32 (as Qwen3 does), scale in the input dtype. One rms_norm call
        # instead of pow/mean/add/rsqrt/mul: the same values (a test compares them), and
        # at batch 1, where every launch counts, half the kernels.
        normed = F.rms_norm(x.float(), (x.shape[-1],), None, self.eps)
        return self.weight * normed.to(x.dtype)


def rope_cos_sin(pos_BT: Tensor, inv_freq: Tensor, dtype: torch.dtype
                 ) -> tuple[Tensor, Tensor]:
    """cos and SIGNED sin [B, 1, T, d] for absolute positions (the 1 broadcasts over
    heads): the sin's first half negated, which is where rotate_half puts -x2."""
    freqs_BTh = pos_BT[..., None].float() * inv_freq
    sin_BTh = freqs_BTh.sin()
    cos_BTd = torch.cat([freqs_BTh, freqs_BTh], dim=-1).cos()
    sin_BTd = torch.cat([-sin_BTh, sin_BTh], dim=-1)
    return cos_BTd.to(dtype)[:, None], sin_BTd.to(dtype)[:, None]


def apply_rope(x_BHTd: Tensor, cos_B1Td: Tensor, signed_sin_B1Td: Tensor) -> Tensor:
    """Standard (HF rotate_half) RoPE, x·cos + [-x2, x1]·sin, as x·cos + [x2, x1]·signed
    sin: the same bits (negation is exact) in three kernels fewer."""
    return x_BHTd * cos_B1Td + x_BHTd.roll(x_BHTd.shape[-1] // 2, dims=-1) * signed_sin_B1Td


class KVCache:
    """Per-layer K/V (post k_norm and RoPE, before head repetition), shape [B, G, T, d].

    Decoding appends the new context K/V and the block K/V each cycle, then the caller
    crops back to the block start, keeping context and dropping the block (z-lab's
    DynamicCache.crop pattern). The Qwen3 target (dflash.qwen3) keeps its K/V in one too.
    """

    def __init__(self, num_layers: int) -> None:
        self.k: list[Tensor | None] = [None] * num_layers
        self.v: list[Tensor | None] = [None] * num_layers

    @property
    def length(self) -> int:
        k0 = self.k[0]
        return 0 if k0 is None else k0.shape[2]

    def get_seq_length(self) -> int:
        """:attr:`length` by the name transformers' caches give it."""
        return self.length

    def update(self, layer: int, k_BGTd: Tensor, v_BGTd: Tensor) -> tuple[Tensor, Tensor]:
        old_k, old_v = self.k[layer], self.v[layer]
        if old_k is not None and old_v is not None:
            k_BGTd = torch.cat([old_k, k_BGTd], dim=2)
            v_BGTd = torch.cat([old_v, v_BGTd], dim=2)
        self.k[layer], self.v[layer] = k_BGTd, v_BGTd
        return k_BGTd, v_BGTd

    def crop(self, length: int) -> None:
        if not 0 <= length <= self.length:
            raise ValueError(f"crop length {length} outside [0, {self.length}]")
        for i, (k, v) in enumerate(zip(self.k, self.v, strict=True)):
            if k is not None and v is not None:
                self.k[i], self.v[i] = k[:, :, :length], v[:, :, :length]


class Attention(nn.Module):
    """Queries from the block stream only; keys/values from [context | block] through the
    SAME k_proj/v_proj, k_norm and RoPE. Context skips q, o_proj, residual and MLP."""

    def __init__(self, cfg: DrafterConfig) -> None:
        super().__init__()
        self.n_heads, self.n_kv, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        d_model = cfg.hidden_size
        self.q_proj = nn.Linear(d_model, cfg.num_heads * cfg.head_dim, bias=False)
        self.k_proj = nn.Linear(d_model, cfg.num_kv_heads * cfg.head_dim, bias=False)
        self.v_proj = nn.Linear(d_model, cfg.num_kv_heads * cfg.head_dim, bias=False)
        self.o_proj = nn.Linear(cfg.num_heads * cfg.head_dim, d_model, bias=False)
        self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_eps)  # per head, as in Qwen3
        self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_eps)

    def _kv(self, x_BTD: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
        bsz, t, _ = x_BTD.shape
        k_BTGd = self.k_norm(self.k_proj(x_BTD).view(bsz, t, self.n_kv, self.head_dim))
        k_BGTd = k_BTGd.transpose(1, 2)
        v_BGTd = self.v_proj(x_BTD).view(bsz, t, self.n_kv, self.head_dim).transpose(1, 2)
        return apply_rope(k_BGTd, cos, sin), v_BGTd

    def forward(self, x_BQD: Tensor, ctx_BSD: Tensor, rope_q: tuple[Tensor, Tensor],
                rope_kv: tuple[Tensor, Tensor], attend: AttendFn,
                cache: KVCache | None, layer: int) -> Tensor:
        bsz, q_len, _ = x_BQD.shape
        q_BHQd = self.q_norm(self.q_proj(x_BQD).view(bsz, q_len, self.n_heads, self.head_dim))
        q_BHQd = apply_rope(q_BHQd.transpose(1, 2), *rope_q)
        # Context and block through one k_proj/v_proj/k_norm/RoPE pass: [context | block].
        k_BGKd, v_BGKd = self._kv(torch.cat([ctx_BSD, x_BQD], dim=1), *rope_kv)
        if cache is not None:
            k_BGKd, v_BGKd = cache.update(layer, k_BGKd, v_BGKd)
        # Repeat K/V heads instead of enable_gqa (its flex backward is ~10x slower, [MO]).
        rep = self.n_heads // self.n_kv
        k_BHKd = k_BGKd.repeat_interleave(rep, dim=1)
        v_BHKd = v_BGKd.repeat_interleave(rep, dim=1)
        out_BHQd = attend(q_BHQd, k_BHKd, v_BHKd)
        out_BQD: Tensor = self.o_proj(out_BHQd.transpose(1, 2).reshape(bsz, q_len, -1))
        return out_BQD


class MLP(nn.Module):
    """SwiGLU, as in Qwen3 (the target's own layers use it too: dflash.qwen3)."""

    def __init__(self, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
        return out


class DecoderLayer(nn.Module):
    def __init__(self, cfg: DrafterConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_eps)
        self.mlp = MLP(cfg.hidden_size, cfg.intermediate_size)

    def forward(self, x_BQD: Tensor, ctx_BSD: Tensor, rope_q: tuple[Tensor, Tensor],
                rope_kv: tuple[Tensor, Tensor], attend: AttendFn,
                cache: KVCache | None, layer: int) -> Tensor:
        # ctx_BSD is NOT passed through input_layernorm: it was normed once by hidden_norm.
        x_BQD = x_BQD + self.self_attn(self.input_layernorm(x_BQD), ctx_BSD, rope_q,
                                       rope_kv, attend, cache, layer)
        out_BQD: Tensor = x_BQD + self.mlp(self.post_attention_layernorm(x_BQD))
        return out_BQD


class DFlashDrafter(nn.Module):
    """Parameters: fc, hidden_norm, layers.{i}.*, norm (z-lab checkpoint names)."""

    inv_freq: Tensor

    def __init__(self, cfg: DrafterConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.fc = nn.Linear(cfg.num_features * cfg.hidden_size, cfg.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_eps)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_eps)
        exponent = torch.arange(0, cfg.head_dim, 2, dtype=torch.float32) / cfg.head_dim
        self.register_buffer("inv_freq", 1.0 / (cfg.rope_theta ** exponent), persistent=False)

    def new_cache(self) -> KVCache:
        return KVCache(self.cfg.num_layers)

    def forward(self, block_emb_BQD: Tensor, ctx_feats_BSF: Tensor, pos_block_BQ: Tensor,
                pos_ctx_BS: Tensor, attend: AttendFn, cache: KVCache | None = None
                ) -> Tensor:
        """Hidden states [B, Q, D] after the final norm; apply the target lm_head to them.

        Training: all N blocks at once, ``ctx_feats_BSF`` the whole sequence's
        concatenated target features, ``attend`` carrying the DFlash mask.
        Decoding: one block, ``ctx_feats_BSF`` only the features not yet in ``cache``
        (positions cache.length..start-1), ``attend`` unmasked; crop the cache to
        ``start`` afterwards to drop the block's K/V.
        """
        # Fused target context feature H_t, computed once and shared by every layer.
        ctx_BSD = self.hidden_norm(self.fc(ctx_feats_BSF))
        dtype = block_emb_BQD.dtype
        rope_q = rope_cos_sin(pos_block_BQ, self.inv_freq, dtype)
        # Keys and values come from [context | block]: their RoPE, once for every layer.
        rope_kv = rope_cos_sin(torch.cat([pos_ctx_BS, pos_block_BQ], dim=1), self.inv_freq,
                               dtype)
        x_BQD = block_emb_BQD
        for i, layer in enumerate(self.layers):
            x_BQD = layer(x_BQD, ctx_BSD, rope_q, rope_kv, attend, cache, i)
        out_BQD: Tensor = self.norm(x_BQD)
        return out_BQD
