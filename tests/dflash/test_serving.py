"""A serving-mismatch check (issue 36, item 4): ``dflash-eval --check-config`` and the line
``dflash-train`` prints at export compare the drafter's config with the target's on every
field where a difference makes a serving engine accept nothing, one line each; a hit and a
miss for each field."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from dflash.checkpoint.layout import published_config
from dflash.exitcodes import ExitCode
from dflash.presets import tiny_drafter
from dflash.serving import (
    FIELDS,
    compare,
    drafter_fields,
    export_fields,
    fields_of,
    target_fields,
)
from tests.dflash import launch

TEMPLATE = "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}"
CONFIG = {"model_type": "qwen3", "vocab_size": 512, "hidden_size": 64,
          "intermediate_size": 128, "num_hidden_layers": 8, "num_attention_heads": 4,
          "num_key_value_heads": 2, "head_dim": 16, "rope_theta": 10_000.0,
          "rms_norm_eps": 1e-6, "bos_token_id": 1, "eos_token_id": 2}
TOKENIZER = {"chat_template": TEMPLATE, "pad_token": "<pad>",
             "added_tokens_decoder": {"0": {"content": "<pad>"}, "2": {"content": "</s>"}}}


def _target(folder: Path, config: dict[str, Any] | None = None,
            tokenizer: dict[str, Any] | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(CONFIG if config is None else config))
    if tokenizer != {}:  # {}: no tokenizer at all
        (folder / "tokenizer_config.json").write_text(
            json.dumps(TOKENIZER if tokenizer is None else tokenizer))
    return folder


def _drafter(folder: Path, target: Path, *, scale: float = 1.0) -> Path:
    """An export as the trainer writes it for ``target``."""
    folder.mkdir(parents=True, exist_ok=True)
    config = published_config(tiny_drafter(), "float32")
    fields = export_fields(target_fields(str(target)), scale)
    config.update({k: v for k, v in fields.items() if k != "dflash_config"})
    config["dflash_config"].update(fields["dflash_config"])
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_the_target_fields_come_from_its_files(tmp_path: Path):
    fields = target_fields(str(_target(tmp_path / "t")))
    assert fields["rope_theta"] == 10_000.0 and fields["rope_scaling"] is None
    assert (fields["bos_token_id"], fields["eos_token_id"], fields["pad_token_id"]) == (1, 2, 0)
    assert fields["embedding_scale"] == 1.0 and fields["vocab_size"] == 512
    assert len(fields["chat_template"]) == 64
    assert set(fields) == set(FIELDS)


Mutation = Callable[[dict[str, Any], dict[str, Any]], None]


def _set(key: str, value: Any) -> Mutation:
    def change(config: dict[str, Any], tokenizer: dict[str, Any]) -> None:
        config[key] = value
    return change


def _template(config: dict[str, Any], tokenizer: dict[str, Any]) -> None:
    tokenizer["chat_template"] = TEMPLATE + "<|assistant|>"


def _pad(config: dict[str, Any], tokenizer: dict[str, Any]) -> None:
    tokenizer["pad_token"] = "</s>"


def _gemma(config: dict[str, Any], tokenizer: dict[str, Any]) -> None:
    config["model_type"] = "gemma2"  # Gemma multiplies its embeddings by sqrt(H)


# (field, what changes in the target, the line's start)
HITS: list[tuple[str, Mutation, str]] = [
    ("embedding_scale", _gemma, "embedding scale: drafter 1.0, target 8.0"),
    ("rope_theta", _set("rope_theta", 1_000_000.0), "rope theta: drafter 10000.0, target"),
    ("rope_scaling", _set("rope_scaling", {"rope_type": "yarn", "factor": 4.0}),
     'rope scaling: drafter none, target {"factor": 4.0, "rope_type": "yarn"}'),
    ("rms_norm_eps", _set("rms_norm_eps", 1e-5), "norm eps: drafter 1e-06, target 1e-05"),
    ("vocab_size", _set("vocab_size", 1024), "vocab size: drafter 512, target 1024"),
    ("bos_token_id", _set("bos_token_id", 7), "bos id: drafter 1, target 7"),
    ("eos_token_id", _set("eos_token_id", [2, 9]), "eos id: drafter 2, target [2, 9]"),
    ("pad_token_id", _pad, "pad id: drafter 0, target 2"),
    ("chat_template", _template, "chat template: drafter sha256 "),
]


@pytest.mark.parametrize(("field", "change", "line"), HITS, ids=[h[0] for h in HITS])
def test_each_field_a_hit_and_a_miss(tmp_path: Path, field: str, change: Mutation,
                                     line: str):
    trained_on = _target(tmp_path / "trained-on")
    drafter = json.loads((_drafter(tmp_path / "d", trained_on) / "config.json").read_text())
    miss = compare(drafter_fields(drafter), target_fields(str(trained_on)))
    assert miss.ok and miss.lines() == []
    config, tokenizer = copy.deepcopy(CONFIG), copy.deepcopy(TOKENIZER)
    change(config, tokenizer)
    served = _target(tmp_path / "served", config, tokenizer)
    hit = compare(drafter_fields(drafter), target_fields(str(served)))
    assert [d.field for d in hit.differences] == [field]
    assert hit.lines()[0].startswith(line), hit.lines()


def test_an_eos_list_of_one_is_that_id(tmp_path: Path):
    drafter = {"eos_token_id": [2]}
    assert compare(drafter, {"eos_token_id": 2}).differences == ()


def test_what_an_older_export_does_not_record_is_named_not_compared(tmp_path: Path):
    old = published_config(tiny_drafter(), "float32")  # no special ids, no scale, no template
    check = compare(drafter_fields(old), target_fields(str(_target(tmp_path / "t"))))
    assert check.ok
    assert check.lines() == ["not compared (the drafter's config.json does not record them): "
                             "embedding scale, bos id, eos id, pad id, chat template"]


def test_rope_parameters_of_transformers_5_read_as_rope_scaling():
    plain = fields_of({"rope_parameters": {"rope_type": "default", "rope_theta": 5e5}})
    assert plain["rope_theta"] == 5e5 and plain["rope_scaling"] is None
    yarn = fields_of({"rope_parameters": {"rope_type": "yarn", "factor": 2.0,
                                          "rope_theta": 5e5}})
    assert yarn["rope_scaling"] == {"rope_type": "yarn", "factor": 2.0}


PROBE = """
import sys
from dflash.cli.evaluate import main
rc = main(sys.argv[1:])
print(rc, "torch" in sys.modules)
"""


def _check_config(drafter: Path, target: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", PROBE, "--check-config", "--drafter",
                           str(drafter), "--target", target], cwd=launch.REPO,
                          env=launch.env(), capture_output=True, text=True, timeout=120,
                          check=False)


def test_eval_check_config_passes_a_match_and_names_each_difference(tmp_path: Path):
    trained_on = _target(tmp_path / "trained-on")
    drafter = _drafter(tmp_path / "d", trained_on)
    ok = _check_config(drafter, str(trained_on))
    assert ok.stdout.split()[-2:] == [str(int(ExitCode.OK)), "False"], ok.stderr  # no torch
    assert ok.stdout.splitlines()[0] == ("dflash-eval: the drafter's config matches the "
                                         "target's (embedding scale, rope theta, rope "
                                         "scaling, norm eps, vocab size, bos id, eos id, "
                                         "pad id, chat template)")
    config = {**CONFIG, "rope_theta": 1e6, "eos_token_id": 5}
    served = _target(tmp_path / "served", config)
    bad = _check_config(drafter, str(served))
    assert bad.stdout.split()[-2:] == [str(int(ExitCode.CONFIG_MISMATCH)), "False"]
    lines = bad.stdout.splitlines()[:-1]
    assert lines == [
        "dflash-eval: rope theta: drafter 10000.0, target 1000000.0 (positions rotate at "
        "another rate)",
        "dflash-eval: eos id: drafter 2, target 5 (another end token: drafts run past the "
        "end or stop early)",
        "dflash-eval: 2 difference(s) between the drafter's config and the target's: a "
        "serving engine would accept (almost) none of its drafts"], bad.stdout


def test_eval_check_config_against_a_named_shape(tmp_path: Path):
    drafter = tmp_path / "d"
    drafter.mkdir()
    config = published_config(tiny_drafter(), "float32")
    (drafter / "config.json").write_text(json.dumps(config))
    assert _check_config(drafter, "tiny").stdout.split()[-2] == "0"
    big = _check_config(drafter, "qwen3-8b-shape")
    assert big.stdout.split()[-2] == str(int(ExitCode.CONFIG_MISMATCH))
    assert "vocab size: drafter 512, target 151936" in big.stdout


def _train(out: Path, target: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dflash.cli.train", "--preset", "tiny", "--unguarded",
         "--quiet", "--out", str(out), "--target", target, "--steps", "2",
         *[a for a in launch.SMALL]], cwd=launch.REPO, env=launch.env(),
        capture_output=True, text=True, timeout=400, check=False)


@pytest.mark.slow
def test_the_export_says_whether_it_fits_its_target(tmp_path: Path):
    run = _train(tmp_path / "run", "tiny")
    assert run.returncode == 0, run.stderr[-2000:]
    assert ("dflash-train: serving check: the drafter's config matches the target's"
            in run.stdout), run.stdout
    exported = json.loads((tmp_path / "run" / "drafter" / "config.json").read_text())
    assert exported["dflash_config"]["embedding_scale"] == 1.0
    assert "eos_token_id" in exported and "chat_template_sha256" in exported["dflash_config"]
    # A target whose RoPE is scaled (built by transformers): the drafter's RoPE is not.
    scaled = tmp_path / "scaled"
    _target(scaled, {**CONFIG, "rope_scaling": {"rope_type": "linear", "factor": 2.0}}, {})
    run = _train(tmp_path / "run-scaled", str(scaled))
    assert run.returncode == 0, run.stderr[-2000:]
    assert ("dflash-train: serving check: rope scaling: drafter none, target "
            '{"factor": 2.0, "rope_type": "linear"}' in run.stdout), run.stdout


def test_without_check_config_eval_still_needs_prompts(tmp_path: Path):
    trained_on = _target(tmp_path / "trained-on")
    drafter = _drafter(tmp_path / "d", trained_on)
    proc = subprocess.run([sys.executable, "-c", PROBE, "--drafter", str(drafter),
                           "--target", "tiny"], cwd=launch.REPO, env=launch.env(),
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.stdout.split() == [str(int(ExitCode.BAD_INPUT)), "False"]
    assert proc.stderr == "dflash-eval: one of --prompts or --synthetic is required\n"
