"""dflash-train refuses, before it builds anything, a drafter deeper than its target and a
run that would show the target more tokens than its positions
(``max_position_embeddings``), as dflash-eval and dflash-generate do: the synthetic rows it
would generate (before generating them), the rows of a data file, and the held-out decode's
prompts with their new tokens and a last verify. Past its positions a rotary target gives
features it was never trained on, and the drafter learns from them; a learned position
table fails outright."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from dflash.errors import ConfigError
from dflash.presets import tiny
from dflash.target import TargetModel, load_target
from dflash.train import Trainer

SMALL = {"log_every": 2, "save_every": 0, "eval_every": 2, "synthetic_prompts": 40,
         "synthetic_response_tokens": 40, "held_out": 4, "batch_size": 4, "buckets": (64,),
         "anchors": 8, "peak_tflops": 1.0}


def _target(positions: int | None) -> TargetModel:
    """The tiny target (random weights, its own copy) made for ``positions`` positions
    (None: a config that does not say)."""
    target = load_target("tiny", seed=0)
    target.config = dataclasses.replace(target.config, max_position_embeddings=positions)
    return target


def _data(path: Path, response: int) -> Path:
    """Twelve source files, three rows each: 12 prompt and ``response`` response tokens."""
    rows = [{"source": f"lib/mod{f}.py", "prompt_ids": [1 + f + k] * 12,
             "response_ids": [(5 * f + k + i) % 500 + 1 for i in range(response)]}
            for f in range(12) for k in range(3)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_synthetic_rows_past_the_positions_are_refused_before_any_is_generated(
        tmp_path: Path):
    heard: list[str] = []
    cfg = dataclasses.replace(tiny(), out=str(tmp_path / "run"),  # 12 + 40 tokens a row
                              **{**SMALL, "buckets": (48,)})
    with pytest.raises(ConfigError) as err:
        Trainer(cfg, target=_target(51), on_phase=lambda name, *_: heard.append(name))
    assert str(err.value) == ("synthetic_response_tokens=40: the longest prompt (12 tokens) "
                              "and 40 new tokens pass the target's 51 positions")
    assert heard == []  # no drafter built, nothing generated
    fits = Trainer(dataclasses.replace(cfg, held_out_decode_tokens=8), target=_target(52))
    assert max(len(ex.input_ids) for ex in fits.held_out) == 52  # generated whole, fitting


def test_a_bucket_past_the_positions_is_refused_and_so_is_the_held_out_decode(
        tmp_path: Path):
    data = _data(tmp_path / "d.jsonl", response=40)  # rows of 52 tokens
    cfg = dataclasses.replace(tiny(), out=str(tmp_path / "run"), data=str(data), **SMALL)
    heard: list[str] = []
    with pytest.raises(ConfigError) as err:
        Trainer(cfg, target=_target(40), on_phase=lambda name, *_: heard.append(name))
    assert str(err.value) == ("buckets: the largest, 64, passes the target's 40 positions "
                              "(every row is padded to its bucket): set buckets to at most 40")
    assert heard == []  # refused before the drafter is built or the data read
    # Rows cut to 40: they fit, but the held-out decode's 12 prompt tokens, 32 new ones and
    # a last verify of 3 drafts do not.
    cut = dataclasses.replace(cfg, buckets=(40,))
    with pytest.raises(ConfigError) as err:
        Trainer(cut, target=_target(40))
    assert str(err.value) == ("held_out_decode_tokens=32: the longest prompt (12 tokens) and "
                              "32 new tokens and 3 drafts pass the target's 40 positions")
    trainer = Trainer(dataclasses.replace(cut, held_out_decode_tokens=25), target=_target(40))
    assert max(len(ex.input_ids) for ex in trainer.held_out) == 40  # exactly full: fine
    assert Trainer(dataclasses.replace(cut, held_out_decode_prompts=0), target=_target(40))
    # A warm-up-only run pads random rows to each bucket: refused alike.
    with pytest.raises(ConfigError, match="buckets: the largest, 64, passes"):
        Trainer(cfg, target=_target(40), shapes_only=True)


def test_a_target_whose_config_does_not_say_is_not_checked(tmp_path: Path):
    cfg = dataclasses.replace(tiny(), out=str(tmp_path / "run"), **SMALL)
    assert Trainer(cfg, target=_target(None)).held_out


def test_a_drafter_deeper_than_its_target_is_refused_before_it_is_built(tmp_path: Path):
    """``draft_layers=100000`` was built layer by layer until memory ran out (exit 4 after
    minutes, or the OOM killer); the tiny target has 8 layers."""
    heard: list[str] = []
    cfg = dataclasses.replace(tiny(), out=str(tmp_path / "run"), draft_layers=100_000, **SMALL)
    with pytest.raises(ConfigError) as err:
        Trainer(cfg, target=_target(64), on_phase=lambda name, *_: heard.append(name))
    assert str(err.value) == "draft_layers=100000: deeper than the target (8 layers) it drafts for"
    assert heard == []
    assert Trainer(dataclasses.replace(cfg, draft_layers=8), target=_target(64)).held_out


def test_dflash_train_says_so_in_one_line_exit_2(tmp_path: Path, capsys):
    from dflash.cli.train import main

    config = {"model_type": "qwen3", "vocab_size": 512, "hidden_size": 32,
              "intermediate_size": 64, "num_hidden_layers": 12, "num_attention_heads": 4,
              "num_key_value_heads": 2, "head_dim": 8, "max_position_embeddings": 64}
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert main(["--preset", "tiny", "--quiet", "--target", str(tmp_path / "config.json"),
                 "--out", str(tmp_path / "run"), "--set", "device=cpu", "--set", "buckets=64",
                 "--unguarded"]) == 2
    err = capsys.readouterr().err
    assert err.splitlines() == [
        "dflash-train: synthetic_response_tokens=96: the longest prompt (12 tokens) and 96 "
        "new tokens pass the target's 64 positions"], err
