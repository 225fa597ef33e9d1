"""dflash's own Qwen3 against transformers' (the oracle): the same weights from the same
seed, the same outputs, checkpoints read both ways, and transformers kept off the path."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from dflash import qwen3
from dflash.errors import TargetError
from dflash.model import KVCache
from dflash.target import load_target
from tests.dflash.launch import REPO

SMALL = {"model_type": "qwen3", "vocab_size": 96, "hidden_size": 32, "intermediate_size": 48,
         "num_hidden_layers": 8, "num_attention_heads": 4, "num_key_value_heads": 2,
         "head_dim": 8, "rope_theta": 5000.0, "rms_norm_eps": 1e-6}


def _transformers_model(config: dict[str, Any], seed: int) -> Any:
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**config))
    return model.eval()


def _compare_decoding(a: Any, b: Any, ids: torch.Tensor, atol: float) -> None:
    """Prefill, verify-like extensions cropped back, single steps: logits and features."""
    ca, cb = a.new_cache(), b.new_cache()
    pos = 0
    for width, keep in ((9, 9), (5, 2), (1, 1), (6, 6), (4, 1), (1, 1)):
        chunk = ids[:, pos:pos + width]
        la, fa = a.forward_cached(chunk, ca, pos)
        lb, fb = b.forward_cached(chunk, cb, pos)
        torch.testing.assert_close(la, lb, rtol=0, atol=atol)
        torch.testing.assert_close(fa, fb, rtol=0, atol=atol)
        pos += keep
        a.crop_cache(ca, pos)
        b.crop_cache(cb, pos)
    assert a.cache_length(ca) == b.cache_length(cb) == pos


def test_a_named_shape_is_the_same_network_as_transformers_builds(monkeypatch):
    own = load_target("tiny", seed=5)
    monkeypatch.setenv("DFLASH_TARGET_BACKEND", "transformers")
    theirs = load_target("tiny", seed=5)
    assert isinstance(own.model, qwen3.Qwen3ForCausalLM)
    assert type(theirs.model).__module__.startswith("transformers.")
    # The same names in the same order draw the same random weights.
    mine, other = dict(own.model.named_parameters()), dict(theirs.model.named_parameters())
    assert sorted(mine) == sorted(other)
    for name, tensor in mine.items():
        assert torch.equal(tensor, other[name]), name
    ids = torch.randint(0, 511, (3, 40), generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(own.features(ids), theirs.features(ids), rtol=0, atol=1e-6)
    _compare_decoding(own, theirs, ids, atol=1e-5)


def test_a_tied_random_target_draws_the_same_weights_as_transformers(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    # The 1.7B shape ties its head: transformers ties after the draws, dflash at build.
    (tmp_path / "config.json").write_text(json.dumps({**SMALL, "tie_word_embeddings": True}))
    own = load_target(str(tmp_path), seed=4)
    monkeypatch.setenv("DFLASH_TARGET_BACKEND", "transformers")
    theirs = load_target(str(tmp_path), seed=4)
    assert own.model.lm_head.weight is own.model.model.embed_tokens.weight
    mine, other = dict(own.model.named_parameters()), dict(theirs.model.named_parameters())
    assert sorted(mine) == sorted(other)
    for name, tensor in mine.items():
        assert torch.equal(tensor, other[name]), name


@pytest.mark.parametrize("tied, shard", [(False, None), (True, "40KB")])
def test_a_transformers_checkpoint_loads_into_the_own_network(tmp_path: Path, tied: bool,
                                                              shard: str | None):
    config = {**SMALL, "tie_word_embeddings": tied}
    reference = _transformers_model(config, seed=1)
    kwargs = {"max_shard_size": shard} if shard else {}
    reference.save_pretrained(tmp_path / "ckpt", **kwargs)
    if shard:
        assert (tmp_path / "ckpt" / "model.safetensors.index.json").is_file()
    target = load_target(str(tmp_path / "ckpt"), layer_ids=(0, 1))
    assert isinstance(target.model, qwen3.Qwen3ForCausalLM)
    assert target.model.config.tie_word_embeddings is tied
    assert (target.model.lm_head.weight is target.model.model.embed_tokens.weight) is tied
    ids = torch.randint(0, 96, (2, 30), generator=torch.Generator().manual_seed(2))
    expected = reference(input_ids=ids, output_hidden_states=True)
    torch.testing.assert_close(target.model(ids).logits, expected.logits, rtol=0, atol=1e-5)
    # hidden_states[i + 1]: layer i's output (the last entry is after the final norm)
    taps = torch.cat([expected.hidden_states[1], expected.hidden_states[2]], dim=-1)
    torch.testing.assert_close(target.features(ids), taps, rtol=0, atol=1e-5)
    half = load_target(str(tmp_path / "ckpt"), dtype=torch.bfloat16)
    assert half.dtype == torch.bfloat16
    assert half.model.model.inv_freq.dtype == torch.float32  # RoPE stays fp32


def test_its_own_checkpoint_reads_back_in_both(tmp_path: Path):
    own = load_target("tiny", seed=2)
    own.model.save_pretrained(tmp_path / "saved")
    back = load_target(str(tmp_path / "saved"), layer_ids=own.layer_ids)
    ids = torch.arange(20)[None]
    torch.testing.assert_close(back.features(ids), own.features(ids), rtol=0, atol=0)
    from transformers import AutoModelForCausalLM

    theirs = AutoModelForCausalLM.from_pretrained(tmp_path / "saved", local_files_only=True)
    torch.testing.assert_close(theirs(input_ids=ids).logits, own.model(ids).logits,
                               rtol=0, atol=1e-5)


def test_transformers_5_configs_name_the_rope_base_inside_rope_parameters():
    raw = {k: v for k, v in SMALL.items() if k != "rope_theta"}
    cfg = qwen3.config_from_json({**raw, "rope_parameters": {"rope_type": "default",
                                                              "rope_theta": 123.0}})
    assert cfg is not None and cfg.rope_theta == 123.0
    # And what the installed transformers writes parses to the values it reads.
    reference = _transformers_model(SMALL, seed=0)
    written = json.loads(reference.config.to_json_string())
    parsed = qwen3.config_from_json(written)
    assert parsed is not None
    assert (parsed.rope_theta, parsed.head_dim, parsed.num_key_value_heads) == (5000.0, 8, 2)


@pytest.mark.parametrize("change", [
    {"model_type": "qwen2"}, {"attention_bias": True}, {"use_sliding_window": True},
    {"rope_scaling": {"rope_type": "yarn", "factor": 4.0}},
    {"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}},
    {"layer_types": ["full_attention"] * 7 + ["sliding_attention"]},
])
def test_a_config_it_does_not_run_exactly_is_left_to_transformers(tmp_path: Path,
                                                                   change: dict[str, Any]):
    raw = {**SMALL, **change}
    assert qwen3.config_from_json(raw) is None
    if change == {"attention_bias": True}:
        (tmp_path / "config.json").write_text(json.dumps(raw))
        target = load_target(str(tmp_path), seed=0)
        assert type(target.model).__module__.startswith("transformers.")
        assert target.model.model.layers[0].self_attn.q_proj.bias is not None


def test_a_qwen3_config_missing_a_field_is_a_one_line_error():
    with pytest.raises(TargetError, match="bad or missing field: 'hidden_size'"):
        qwen3.config_from_json({k: v for k, v in SMALL.items() if k != "hidden_size"})


def _saved(tmp_path: Path) -> Path:
    folder = tmp_path / "ckpt"
    _transformers_model(SMALL, seed=0).save_pretrained(folder)
    return folder


def test_damaged_weights_are_one_line_errors(tmp_path: Path):
    from safetensors.torch import load_file, save_file

    folder = _saved(tmp_path)
    weights = folder / "model.safetensors"
    good = load_file(str(weights))
    cases = {
        "no tensor for 'model.norm.weight'":
            {k: v for k, v in good.items() if k != "model.norm.weight"},
        "unexpected tensor 'model.extra.weight'": {**good, "model.extra.weight": torch.ones(2)},
        "model.norm.weight has shape \\[31\\], the config says \\[32\\]":
            {**good, "model.norm.weight": torch.ones(31)},
    }
    for message, state in cases.items():
        save_file(state, str(weights))
        with pytest.raises(TargetError, match=message):
            load_target(str(folder))
    save_file(good, str(weights))
    good_bytes = weights.read_bytes()
    weights.write_bytes(good_bytes[:200])  # truncated in the header
    with pytest.raises(TargetError, match=r"model\.safetensors: not a whole safetensors file "
                                          r"\(its header is cut short: 192 of "):
        load_target(str(folder))
    weights.write_bytes(good_bytes[:-100])  # the header whole, the last tensor cut short
    with pytest.raises(TargetError, match="weights do not read"):
        load_target(str(folder))


def test_the_target_crops_its_own_cache_as_it_crops_transformers_cache():
    target = load_target("tiny", seed=0)
    cache = target.new_cache()
    assert isinstance(cache, KVCache)  # the drafter's cache class, one copy of it
    target.forward_cached(torch.zeros(1, 10, dtype=torch.long), cache, 0)
    target.crop_cache(cache, 7)
    assert target.cache_length(cache) == cache.get_seq_length() == 7
    target.crop_cache(cache, 7)  # nothing to remove
    assert all(k is not None and k.shape[2] == 7 for k in cache.k)
    with pytest.raises(ValueError, match="cannot crop a cache of 7 to 8"):
        target.crop_cache(cache, 8)


def test_a_qwen3_target_builds_loads_and_decodes_without_importing_transformers(
        tmp_path: Path):
    # The trainer's start path: transformers' import is seconds on a GPU host.
    _transformers_model(SMALL, seed=0).save_pretrained(tmp_path / "ckpt")
    code = f"""
import sys, torch
from dflash.target import load_target
for source in ("tiny", {str(tmp_path / "ckpt")!r}):
    t = load_target(source)
    cache = t.new_cache()
    t.forward_cached(torch.zeros(1, 4, dtype=torch.long), cache, 0)
    t.features(torch.zeros(1, 4, dtype=torch.long))
bad = sorted(m for m in sys.modules if m.split(".")[0] == "transformers")
print(bad[:3])
sys.exit(1 if bad else 0)
"""
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]


def _aten_ops(fn: Any) -> list[str]:
    from torch.profiler import profile

    with profile() as prof:
        fn()
    return [e.name for e in prof.events() if e.name.startswith("aten::")]


@torch.no_grad()
def test_the_last_position_s_logits_take_a_plain_matmul():
    """A slice of a batch given to the LM head made F.linear expand the head into a
    batched matmul that reads all of it once per row (209 ms at the 8B shape, 512 rows);
    contiguous, it is one matmul. The same logits as the full forward's last row."""
    target = load_target("tiny", seed=0)
    ids = torch.randint(0, 500, (8, 16), generator=torch.Generator().manual_seed(0))
    last = target.model(input_ids=ids, logits_to_keep=1).logits
    torch.testing.assert_close(last, target.model(input_ids=ids).logits[:, -1:])
    assert "aten::bmm" not in _aten_ops(lambda: target.model(input_ids=ids, logits_to_keep=1))
    # What it was, on the torch this was found with (2.11, 2.13): the slice itself through
    # the head takes the batched matmul. Newer torch (2.15) lowers such a slice to one
    # matmul by itself, so that half is checked only where torch still takes the bmm.
    hidden = target.model.model(ids, torch.arange(16).expand(8, 16), None)
    sliced = _aten_ops(lambda: target.model.lm_head(hidden[:, -1:]))
    from packaging.version import Version

    if Version(torch.__version__).release < (2, 15):
        assert "aten::bmm" in sliced


@pytest.mark.parametrize("t,k,padded", [(1, 7, False), (1, 7, True), (3, 7, False),
                                        (3, 7, True), (5, 5, False)])
def test_grouped_attention_equals_repeating_the_kv_heads(t: int, k: int, padded: bool):
    # 8 query heads on 2 K/V heads; the oracle repeats K/V per head as transformers does.
    g = torch.Generator().manual_seed(0)
    q, kk, v = (torch.randn(2, h, n, 4, generator=g) for h, n in ((8, t), (2, k), (2, k)))
    keys = torch.tensor([[0, 0, 1, 1, 1, 1, 1][-k:], [1] * k]) if padded else None
    seen = qwen3.visibility(t, k, q.device, keys)
    mask = None if seen is None or isinstance(seen, str) else seen
    want = torch.nn.functional.scaled_dot_product_attention(
        q, kk.repeat_interleave(4, 1), v.repeat_interleave(4, 1), attn_mask=mask,
        is_causal=isinstance(seen, str))
    torch.testing.assert_close(qwen3.causal_attention(q, kk, v, seen), want,
                               rtol=1e-6, atol=1e-6)
