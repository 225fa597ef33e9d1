"""dflash-generate: the target's own responses, batched without changing them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

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


@pytest.mark.parametrize("backend", ["dflash", "transformers"])
def test_a_left_padded_batch_decodes_each_row_as_alone(backend, monkeypatch):
    # Ten lengths in batches of four: every batch but the last mixes lengths, so rows are
    # left-padded by 1 to 9 positions, and the padding must change nothing of a row.
    from dflash.target import load_target

    monkeypatch.setenv("DFLASH_TARGET_BACKEND", backend)
    target = load_target("tiny", seed=3)
    prompts = [synthetic_prompts(1, vocab_size=512, length=n, seed=n, exclude=(511,))[0]
               for n in (12, 3, 7, 10, 4, 9, 5, 11, 6, 8)]
    seen: list[tuple[int, int]] = []
    batched = generate_responses(target, prompts, max_new_tokens=16, batch_size=4,
                                 on_progress=lambda done, total: seen.append((done, total)))
    assert seen == [(4, 10), (8, 10), (10, 10)]  # one batch per four prompts, not per length
    for prompt, got in zip(prompts, batched, strict=True):
        assert tuple(got) == target_greedy(target, prompt, max_new_tokens=16).tokens


def test_padding_is_masked_and_a_padding_query_sees_itself():
    from dflash.qwen3 import visibility

    keys = torch.tensor([[1, 1, 1, 1], [0, 0, 1, 1]])
    seen = visibility(4, 4, torch.device("cpu"), keys)  # a prefill of two rows
    assert seen.shape == (2, 1, 4, 4)
    assert torch.equal(seen[0, 0], torch.ones(4, 4).tril().bool())
    assert torch.equal(seen[1, 0], torch.tensor([[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0],
                                                 [0, 0, 1, 1]]).bool())
    step = visibility(1, 5, torch.device("cpu"), torch.tensor([[0, 1, 1, 1, 1]]))
    assert torch.equal(step[0, 0], torch.tensor([[0, 1, 1, 1, 1]]).bool())


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
        # One line says what is wrong; the lines before it are progress ("phase… [1.2 s]").
        *progress, error = proc.stderr.strip().splitlines()
        assert all(line.endswith(" s]") for line in progress), proc.stderr
        assert not error.endswith(" s]"), proc.stderr
        assert "Traceback" not in proc.stderr
    assert out.read_text() == "precious\n"  # nothing the user had is lost


@pytest.mark.parametrize("n", [0, -1])
def test_synthetic_rejects_empty(n: int):
    with pytest.raises(ValueError):
        synthetic_prompts(n, vocab_size=10, length=3, seed=0)


def test_progress_callback_counts_every_prompt(tiny_target):
    prompts = synthetic_prompts(5, vocab_size=512, length=7, seed=8, exclude=(511,))
    prompts += synthetic_prompts(2, vocab_size=512, length=4, seed=9, exclude=(511,))
    seen: list[tuple[int, int]] = []
    generate_responses(tiny_target, prompts, max_new_tokens=3, batch_size=2,
                       on_progress=lambda done, total: seen.append((done, total)))
    assert seen[-1] == (7, 7) and all(total == 7 for _, total in seen)
    assert [d for d, _ in seen] == sorted(d for d, _ in seen) and len(seen) == 4


def test_cli_progress_goes_to_stderr(tmp_path: Path, capsys):
    out = tmp_path / "data.jsonl"
    assert main(["--target", "tiny", "--synthetic", "3", "--prompt-length", "4", "--out",
                 str(out), "--max-new-tokens", "4", "--device", "cpu",
                 "--batch-size", "1"]) == 0
    captured = capsys.readouterr()
    assert captured.out.strip() == f"dflash-generate: wrote 3 rows to {out}"
    err = captured.err
    for phase in ("loading the target tiny", "reading the prompts", "generating up to 4",
                  "prompt 1/3 (33 %)", "prompt 3/3 (100 %)", "writing"):
        assert phase in err, err
    assert main(["--target", "tiny", "--synthetic", "2", "--out", str(out),
                 "--max-new-tokens", "2", "--device", "cpu", "--quiet"]) == 0
    assert capsys.readouterr().err == ""


def test_progress_lines_every_tenth_when_piped():
    import io

    from dflash.cli.progress import Progress

    stream = io.StringIO()
    progress = Progress("prog", stream=stream, terminal=False)
    progress.phase("loading")
    progress.start("prompt", 40)
    for i in range(1, 41):
        progress.update(i)
    lines = stream.getvalue().splitlines()
    assert lines[0].startswith("prog: loading… [")
    assert [line.split(" [")[0] for line in lines[1:]] == [
        f"prog: prompt {4 * k}/40 ({10 * k} %)" for k in range(1, 11)]


def test_progress_bar_on_a_terminal_and_quiet():
    import io

    from dflash.cli.progress import Progress

    stream = io.StringIO()
    with Progress("prog", stream=stream, terminal=True) as progress:
        progress.start("prompt", 3)
        for i in range(1, 4):
            progress.update(i)
        progress.say("done")
        progress.phase("reading /tmp/\x1b[2J[bold]p.jsonl")  # a hostile path, over the bar
    assert "prog: done" in stream.getvalue()
    assert "reading /tmp/\\x1b[2J[bold]p.jsonl…" in stream.getvalue()
    assert "\x1b[2J" not in stream.getvalue()
    quiet = io.StringIO()
    with Progress("prog", stream=quiet, quiet=True) as progress:
        progress.phase("loading")
        progress.start("prompt", 3)
        progress.update(3)
    assert quiet.getvalue() == ""
