from __future__ import annotations

import dataclasses

import pytest
import torch

from dflash.config import DrafterConfig, target_layer_ids_for
from dflash.model import DFlashDrafter
from dflash.presets import DRAFTER_PRESETS, qwen3_8b_drafter, tiny_drafter


@pytest.mark.parametrize(("num_layers", "k", "expected"), [
    (36, 5, [1, 9, 17, 25, 33]),   # Qwen3-8B
    (32, 5, [1, 8, 15, 22, 29]),   # Llama-3.1-8B
    (36, 1, [18]),
    (8, 3, [1, 3, 5]),
    (28, 2, [1, 25]),
])
def test_target_layer_ids_formula(num_layers: int, k: int, expected: list[int]) -> None:
    assert target_layer_ids_for(num_layers, k) == expected


def test_target_layer_ids_refuses_duplicates() -> None:
    with pytest.raises(ValueError, match="explicitly"):
        target_layer_ids_for(6, 5)  # formula gives [1, 2, 2, 2, 3]


@pytest.mark.parametrize(("field", "value", "match"), [
    ("hidden_size", 0, "hidden_size"),
    ("num_layers", -1, "num_layers"),
    ("head_dim", 15, "head_dim"),
    ("num_kv_heads", 3, "num_kv_heads"),
    ("block_size", 1, "block_size"),
    ("mask_token_id", 512, "mask_token_id"),
    ("mask_token_id", -1, "mask_token_id"),
    ("gamma", 0.0, "gamma"),
    ("rms_eps", 0.0, "rms_eps"),
    ("rope_theta", -1.0, "rope_theta"),
    ("target_layer_ids", (), "target_layer_ids"),
    ("target_layer_ids", (3, 1), "target_layer_ids"),
    ("target_layer_ids", (1, 1, 3), "target_layer_ids"),
    ("target_layer_ids", (1, 8), "target_layer_ids"),
    ("vocab_size", 1.5, "vocab_size"),
])
def test_validation_names_the_field(field: str, value: object, match: str) -> None:
    d = tiny_drafter().to_dict()
    d[field] = value
    with pytest.raises(ValueError, match=match):
        DrafterConfig.from_dict(d)


def test_dict_round_trip_and_unknown_field() -> None:
    for make in DRAFTER_PRESETS.values():
        cfg = make()
        assert DrafterConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ValueError, match="bogus"):
        DrafterConfig.from_dict({**tiny_drafter().to_dict(), "bogus": 1})
    with pytest.raises(TypeError):
        DrafterConfig(hidden_size=64)  # type: ignore[call-arg]


def test_qwen3_8b_preset_matches_doc() -> None:
    cfg = qwen3_8b_drafter()
    assert cfg.target_layer_ids == (1, 9, 17, 25, 33)
    assert (cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == (4096, 32, 8, 128)
    assert (cfg.block_size, cfg.mask_token_id, cfg.vocab_size) == (16, 151669, 151936)
    assert dataclasses.fields(cfg)  # slots dataclass still introspectable
    with torch.device("meta"):
        model = DFlashDrafter(cfg)
    n_params = sum(p.numel() for p in model.parameters())
    assert 1.04e9 < n_params < 1.06e9  # ~5 x 192.9M layers + 83.9M fc
