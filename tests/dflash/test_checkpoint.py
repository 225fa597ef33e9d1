"""Checkpoints: the published DFlash layout, exact round trips, atomic replacement,
and one-line errors for broken folders."""

from __future__ import annotations

import json
import re
import shutil
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from dflash.checkpoint.export import export_drafter, load_drafter
from dflash.checkpoint.layout import config_from_published, latest_checkpoint, published_config
from dflash.checkpoint.local import load_training_checkpoint, save_training_checkpoint
from dflash.errors import CheckpointError
from dflash.model import DFlashDrafter
from dflash.presets import qwen3_8b_drafter, tiny_drafter


def _drafter(seed: int = 0) -> DFlashDrafter:
    torch.manual_seed(seed)
    return DFlashDrafter(tiny_drafter())


def test_export_is_the_published_layout_and_round_trips(tmp_path: Path) -> None:
    drafter = _drafter()
    folder = export_drafter(drafter, tmp_path / "drafter", dtype=torch.float32)
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["DFlashDraftModel"]
    assert config["block_size"] == 4
    assert config["dflash_config"] == {"mask_token_id": 511, "target_layer_ids": [1, 3, 5]}
    assert config["num_hidden_layers"] == 2 and config["num_target_layers"] == 8
    names = set(load_file(str(folder / "model.safetensors")))
    # z-lab's parameter names: fc, hidden_norm, layers.{i}.*, norm; no embedding, no head.
    assert {"fc.weight", "hidden_norm.weight", "norm.weight",
            "layers.0.self_attn.q_proj.weight", "layers.1.mlp.down_proj.weight",
            "layers.0.self_attn.k_norm.weight"} <= names
    assert not any("embed" in n or "lm_head" in n for n in names)
    loaded = load_drafter(folder)
    assert loaded.cfg == drafter.cfg
    for (n, a), (_, b) in zip(drafter.state_dict().items(), loaded.state_dict().items(),
                              strict=True):
        assert torch.equal(a, b), n


def test_published_config_reads_back_the_paper_drafter() -> None:
    cfg = qwen3_8b_drafter()
    assert config_from_published(published_config(cfg, "bfloat16")) == cfg


def test_bf16_export_halves_the_file(tmp_path: Path) -> None:
    drafter = _drafter()
    f32 = export_drafter(drafter, tmp_path / "a", dtype=torch.float32)
    bf16 = export_drafter(drafter, tmp_path / "b")
    ratio = (bf16 / "model.safetensors").stat().st_size / (f32 / "model.safetensors").stat().st_size
    assert 0.45 < ratio < 0.55
    assert json.loads((bf16 / "config.json").read_text())["torch_dtype"] == "bfloat16"


def test_export_replaces_an_existing_folder_whole(tmp_path: Path) -> None:
    first = export_drafter(_drafter(0), tmp_path / "d", dtype=torch.float32)
    (first / "stale.txt").write_text("from the old export")
    export_drafter(_drafter(1), tmp_path / "d", dtype=torch.float32)
    assert not (tmp_path / "d" / "stale.txt").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d"]  # no temp or .old left


def test_training_checkpoints_rotate_and_latest_points_at_the_newest(tmp_path: Path) -> None:
    drafter = _drafter()
    weights = dict(drafter.state_dict())
    for step in (10, 20, 30):
        save_training_checkpoint(tmp_path, step, drafter.cfg, weights,
                                      {"step": step, "rng": torch.get_rng_state()}, keep=2)
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert names == ["latest", "step-00000020", "step-00000030"]
    latest = latest_checkpoint(tmp_path)
    assert latest is not None and latest.name == "step-00000030"
    loaded, state = load_training_checkpoint(latest, "cpu")
    assert state["step"] == 30 and loaded.cfg == drafter.cfg


def test_no_checkpoint_yet_is_none(tmp_path: Path) -> None:
    assert latest_checkpoint(tmp_path) is None


@pytest.mark.parametrize("damage", ["no-config", "bad-json", "not-dflash", "truncated",
                                    "wrong-shape"])
def test_broken_exports_give_one_line_errors(tmp_path: Path, damage: str) -> None:
    folder = export_drafter(_drafter(), tmp_path / "d", dtype=torch.float32)
    config = folder / "config.json"
    weights = folder / "model.safetensors"
    if damage == "no-config":
        config.unlink()
    elif damage == "bad-json":
        config.write_text("{ not json")
    elif damage == "not-dflash":
        config.write_text(json.dumps({"model_type": "qwen3", "hidden_size": 64}))
    elif damage == "truncated":
        weights.write_bytes(weights.read_bytes()[:100])
    else:
        d = json.loads(config.read_text())
        d["intermediate_size"] = 96
        config.write_text(json.dumps(d))
    with pytest.raises(CheckpointError) as err:
        load_drafter(folder)
    assert "\n" not in str(err.value)


def test_latest_naming_a_missing_folder_is_refused(tmp_path: Path) -> None:
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "latest").write_text("step-00000099\n")
    with pytest.raises(CheckpointError, match="not a checkpoint"):
        latest_checkpoint(tmp_path)


@pytest.mark.parametrize(("field", "value", "says"), [
    ("num_hidden_layers", 100_000_000, "holds 2 drafter layers, its config.json says 100000000"),
    ("intermediate_size", 1_000_000, "config says (64, 1000000)"),
    ("hidden_size", 1_000_000, "config says"),
])
def test_a_config_that_does_not_describe_its_weights_is_refused_before_a_build(
        trained_tiny, tmp_path: Path, field: str, value: int, says: str):
    """A drafter folder whose config.json was edited (or corrupted) to an enormous drafter:
    the header of model.safetensors says what it holds, so loading it is one
    CheckpointError in well under the time even one such drafter would take to build."""
    folder = tmp_path / "drafter"
    shutil.copytree(trained_tiny.result.export, folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, field: value}))
    started = time.perf_counter()
    with pytest.raises(CheckpointError, match=re.escape(says)):
        load_drafter(folder)
    assert time.perf_counter() - started < 10
