"""The frozen target: tapped features, early exit, cached decoding, shapes and sources.

Real models with random weights (nothing can be downloaded here): dflash's own Qwen3, and
transformers' as the oracle for it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from dflash.config import target_layer_ids_for
from dflash.errors import TargetError
from dflash.presets import TARGET_SHAPES
from dflash.target import (
    default_mask_token_id,
    drafter_config_for,
    load_target,
)


def test_features_are_the_tapped_hidden_states(tiny_target, tmp_path: Path):
    ids = torch.randint(0, 511, (2, 24), generator=torch.Generator().manual_seed(0))
    feats = tiny_target.features(ids)
    # The oracle: transformers' own Qwen3 with the same weights, and its hidden_states.
    from transformers import AutoModelForCausalLM

    tiny_target.model.save_pretrained(tmp_path / "saved")
    reference = AutoModelForCausalLM.from_pretrained(tmp_path / "saved", local_files_only=True)
    out = reference(input_ids=ids, output_hidden_states=True)
    # Layer id i is the OUTPUT of decoder layer i, i.e. hidden_states[i + 1].
    expected = torch.cat([out.hidden_states[i + 1] for i in tiny_target.layer_ids], dim=-1)
    assert feats.shape == (2, 24, len(tiny_target.layer_ids) * tiny_target.hidden_size)
    torch.testing.assert_close(feats, expected, rtol=0, atol=0)
    off_by_one = torch.cat([out.hidden_states[i] for i in tiny_target.layer_ids], dim=-1)
    assert not torch.allclose(feats, off_by_one)


def test_features_stop_after_the_highest_tap(tiny_target):
    ran: list[int] = []
    hooks = [layer.register_forward_pre_hook(lambda m, a, i=i: ran.append(i))
             for i, layer in enumerate(tiny_target.layers)]
    try:
        tiny_target.features(torch.zeros(1, 8, dtype=torch.long))
    finally:
        for h in hooks:
            h.remove()
    assert ran == list(range(max(tiny_target.layer_ids) + 1))
    assert ran[-1] < tiny_target.num_layers - 1


def test_features_ignore_right_padding(tiny_target):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 511, (1, 20), generator=g)
    padded = torch.cat([ids, torch.zeros(1, 12, dtype=torch.long)], dim=1)
    torch.testing.assert_close(tiny_target.features(padded)[:, :20], tiny_target.features(ids))


def test_cached_forward_with_crops_equals_full_forward(tiny_target):
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(0, 511, (1, 30), generator=g)
    full = tiny_target.model(input_ids=ids).logits.float()
    feats = tiny_target.features(ids)
    cache = tiny_target.new_cache()
    got, _ = tiny_target.forward_cached(ids[:, :10], cache, 0)
    torch.testing.assert_close(got, full[:, :10], rtol=1e-5, atol=1e-5)
    # Several verify-like cycles: run 6 tokens, keep only some of them, continue.
    pos = 10
    for keep in (3, 1, 6, 2):
        wrong = torch.randint(0, 511, (1, 6), generator=g)
        wrong[:, :keep] = ids[:, pos:pos + keep]
        logits, f = tiny_target.forward_cached(wrong, cache, pos)
        torch.testing.assert_close(logits[:, :keep], full[:, pos:pos + keep], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(f[:, :keep], feats[:, pos:pos + keep], rtol=1e-5, atol=1e-5)
        tiny_target.crop_cache(cache, pos + keep)
        pos += keep
    assert tiny_target.cache_length(cache) == pos
    with pytest.raises(ValueError):
        tiny_target.forward_cached(ids[:, :1], cache, pos + 1)


def test_target_is_frozen(tiny_target):
    assert not tiny_target.model.training
    assert all(not p.requires_grad for p in tiny_target.model.parameters())


def test_named_shapes_match_the_published_models():
    s8 = TARGET_SHAPES["qwen3-8b-shape"]
    assert (s8.num_layers, s8.hidden_size, s8.num_heads, s8.num_kv_heads) == (36, 4096, 32, 8)
    assert target_layer_ids_for(s8.num_layers, 5) == [1, 9, 17, 25, 33]
    s17 = TARGET_SHAPES["qwen3-1.7b-shape"]
    assert (s17.num_layers, s17.hidden_size, s17.tie_embeddings) == (28, 2048, True)


def test_drafter_config_follows_the_target(tiny_target):
    cfg = drafter_config_for(tiny_target, num_layers=2, block_size=4, gamma=4.0)
    assert (cfg.hidden_size, cfg.vocab_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == (
        64, 512, 4, 2, 16)
    assert cfg.target_layer_ids == (1, 3, 5) and cfg.num_target_layers == 8
    assert cfg.mask_token_id == 511 and cfg.rope_theta == 10_000.0


def test_config_file_gives_a_random_target_with_formula_taps(tmp_path: Path):
    config = {"model_type": "qwen3", "vocab_size": 300, "hidden_size": 32,
              "intermediate_size": 64, "num_hidden_layers": 12, "num_attention_heads": 4,
              "num_key_value_heads": 2, "head_dim": 8}
    (tmp_path / "config.json").write_text(json.dumps(config))
    a = load_target(str(tmp_path), seed=3)
    b = load_target(str(tmp_path / "config.json"), seed=3)
    assert a.layer_ids == tuple(target_layer_ids_for(12, 5))
    assert a.mask_token_id == 299  # no tokenizer: the last embedding row
    pairs = zip(a.model.named_parameters(), b.model.named_parameters(), strict=True)
    for (na, pa), (_, pb) in pairs:
        assert torch.equal(pa, pb), na


def test_saved_weights_load_back(tmp_path: Path, tiny_target):
    tiny_target.model.save_pretrained(tmp_path / "model")
    loaded = load_target(str(tmp_path / "model"), layer_ids=(1, 3, 5))
    ids = torch.arange(16)[None]
    torch.testing.assert_close(loaded.features(ids), tiny_target.features(ids))


@pytest.mark.parametrize("source, message", [
    ("no-such-shape", "neither a named shape"),
])
def test_bad_sources_are_one_line_errors(source: str, message: str):
    with pytest.raises(TargetError, match=message):
        load_target(source)


def test_bad_config_and_bad_taps(tmp_path: Path):
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(TargetError):
        load_target(str(tmp_path / "config.json"))
    with pytest.raises(TargetError, match="outside"):
        load_target("tiny", layer_ids=(1, 8))


def test_default_mask_token_prefers_a_spare_row():
    class Tok:
        mask_token_id = None

        def __len__(self) -> int:
            return 100

    assert default_mask_token_id(128, Tok()) == 100
    assert default_mask_token_id(100, Tok()) == 99
    assert default_mask_token_id(50, None) == 49
