"""The recipe: presets, typed --set overrides, and the learning-rate schedule."""

from __future__ import annotations

import itertools
import math

import pytest

from dflash.config import TrainConfig
from dflash.optim import lr_at
from dflash.presets import PRESETS, apply_overrides


def test_defaults_are_the_paper_recipe() -> None:
    cfg = PRESETS["qwen3-8b-shape"]()
    assert (cfg.lr, cfg.grad_clip, cfg.warmup_ratio) == (6e-4, 1.0, 0.04)
    assert (cfg.anchors, cfg.block_size, cfg.gamma, cfg.draft_layers) == (512, 16, 7.0, 5)
    assert cfg.buckets == (3072,)


def test_set_overrides_are_typed() -> None:
    cfg = apply_overrides(PRESETS["tiny"](), ["steps=7", "lr=1e-3", "buckets=64,128",
                                              "layer_ids=1,2", "data=none", "peak-tflops=2.5"])
    assert cfg.steps == 7 and cfg.lr == 1e-3 and cfg.buckets == (64, 128)
    assert cfg.layer_ids == (1, 2) and cfg.data is None and cfg.peak_tflops == 2.5


@pytest.mark.parametrize(("pair", "match"), [
    ("stepz=3", "unknown key 'stepz'"),
    ("steps=three", "cannot read 'three'"),
    ("steps", "expects key=value"),
    ("attention=fast", "attention must be"),
    ("buckets=128,64", "buckets must be increasing"),
    ("block_size=1", "block_size must be >= 2"),
    ("weight_decay=nan", "weight_decay must be a finite number, got nan"),  # NaN >= 0 fails
    ("grad_clip=inf", "grad_clip must be a finite number, got inf"),
    ("max_seconds=inf", "max_seconds must be a finite number"),  # no budget: 0
    ("beta2=-inf", "beta2 must be a finite number"),
])
def test_bad_overrides_are_refused(pair: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        apply_overrides(PRESETS["tiny"](), [pair])


def test_lr_warms_up_linearly_then_follows_a_cosine() -> None:
    kw = {"base_lr": 1.0, "total_steps": 100, "warmup_ratio": 0.04}
    assert [lr_at(s, **kw) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert lr_at(4, **kw) == 1.0
    assert lr_at(52, **kw) == pytest.approx(0.5, abs=1e-9)
    assert lr_at(100, **kw) == pytest.approx(0.0, abs=1e-12)
    assert lr_at(100, **kw, min_lr_ratio=0.1) == pytest.approx(0.1)
    mids = [lr_at(s, **kw) for s in range(4, 100)]
    assert all(a >= b for a, b in itertools.pairwise(mids))
    assert not math.isnan(lr_at(0, base_lr=1.0, total_steps=0, warmup_ratio=0.0))


def test_config_to_dict_is_json_ready() -> None:
    d = TrainConfig().to_dict()
    assert d["buckets"] == [3072] and d["layer_ids"] is None
