"""dflash-generate: the target's own responses, batched without changing them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dflash.cli.generate import main
from dflash.data import read_examples
from dflash.decoding.generate import generate_responses, synthetic_prompts
from dflash.decoding.speculative import target_greedy


def test_synthetic_prompts_are_deterministic_and_avoid_mask():
    a = synthetic_prompts(50, vocab_size=16, length=30, seed=1, exclude=(15, 3))
    assert a == synthetic_prompts(50, vocab_size=16, length=30, seed=1, exclude=(15, 3))
    assert a != synthetic_prompts(50, vocab_size=16, length=30, seed=2, exclude=(15, 3))
    flat = {t for row in a for t in row}
    assert 15 not in flat and 3 not in flat and len(flat) == 14


def test_batched_generation_equals_one_at_a_time(tiny_target):
    prompts = synthetic_prompts(5, vocab_size=512, length=9, seed=4, exclude=(511,))
    prompts += synthetic_prompts(2, vocab_size=512, length=5, seed=5, exclude=(511,))
    batched = generate_responses(tiny_target, prompts, max_new_tokens=20, batch_size=3)
    for prompt, got in zip(prompts, batched, strict=True):
        assert tuple(got) == target_greedy(tiny_target, prompt, max_new_tokens=20).tokens


def test_rows_stop_after_their_stop_id(tiny_target):
    prompts = synthetic_prompts(4, vocab_size=512, length=9, seed=6, exclude=(511,))
    free = generate_responses(tiny_target, prompts, max_new_tokens=24)
    stop = free[0][5]
    cut = generate_responses(tiny_target, prompts, max_new_tokens=24, stop_ids=(stop,))
    for f, c in zip(free, cut, strict=True):
        expected = f[: f.index(stop) + 1] if stop in f else f
        assert c == expected


def test_sampling_is_seeded(tiny_target):
    prompts = synthetic_prompts(2, vocab_size=512, length=6, seed=7, exclude=(511,))
    a = generate_responses(tiny_target, prompts, max_new_tokens=12, temperature=1.0, seed=3)
    b = generate_responses(tiny_target, prompts, max_new_tokens=12, temperature=1.0, seed=3)
    c = generate_responses(tiny_target, prompts, max_new_tokens=12, temperature=1.0, seed=4)
    assert a == b and a != c


def test_cli_writes_training_data(tmp_path: Path):
    out = tmp_path / "data.jsonl"
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt_ids": [5, 6, 7, i]}) + "\n"
                               for i in range(3)))
    assert main(["--target", "tiny", "--prompts", str(prompts), "--out", str(out),
                 "--max-new-tokens", "10", "--device", "cpu"]) == 0
    examples = read_examples(out, max_length=64)
    assert len(examples) == 3
    assert all(e.loss_mask == (0,) * 4 + (1,) * 10 for e in examples)
    assert [list(e.input_ids[:4]) for e in examples] == [[5, 6, 7, i] for i in range(3)]


def test_cli_bad_input_is_one_line_exit_2(tmp_path: Path):
    out = tmp_path / "data.jsonl"
    out.write_text("precious\n")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt_ids": [1, 2]}\n{oops\n')
    for argv in (["--target", "tiny", "--prompts", str(bad), "--out", str(out)],
                 ["--target", "nope", "--synthetic", "2", "--out", str(out)],
                 ["--target", "tiny", "--prompts", str(tmp_path / "missing"), "--out",
                  str(out)]):
        proc = subprocess.run([sys.executable, "-m", "dflash.cli.generate", *argv],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert "Traceback" not in proc.stderr
    assert out.read_text() == "precious\n"  # nothing the user had is lost


@pytest.mark.parametrize("n", [0, -1])
def test_synthetic_rejects_empty(n: int):
    with pytest.raises(ValueError):
        synthetic_prompts(n, vocab_size=10, length=3, seed=0)
