"""A held-out τ that predicts decoding (issue 36, item 3): held-out rows come from sources
(files, prompt ids, prompts) that never train, the teacher-forced held-out τ walks the
rows as decoding walks (dflash.replay, tested in test_replay.py), and beside it the
trainer measures a free-running one, decoding a few held-out prompts with the current
drafter against the target."""

from __future__ import annotations

import dataclasses
import json
import re
import time
from pathlib import Path

import pytest

from dflash.data import Example, read_examples
from dflash.decoding.spread import pooled_tau, tau_interval
from dflash.errors import ConfigError, DataError
from dflash.heldout import (
    decode_counts,
    decode_path,
    decode_prompts,
    prompt_of,
    source_key,
    split_by_source,
    window_of,
)
from dflash.presets import tiny
from dflash.replay import replay
from dflash.train import Trainer
from tests.dflash import launch

SMALL = {"log_every": 2, "save_every": 0, "eval_every": 2, "synthetic_prompts": 40,
         "synthetic_response_tokens": 40, "held_out": 4, "batch_size": 4, "buckets": (64,),
         "anchors": 8, "peak_tflops": 1.0}


def _rows(files: int, per_file: int, *, start: int = 1) -> list[dict[str, object]]:
    """Rows as a real prompt set makes them: several prompts cut from each file, the
    file's rows next to one another, 12 prompt and 20 response tokens each."""
    rows = []
    for f in range(files):
        for k in range(per_file):
            base = start + 37 * f + 5 * k
            rows.append({"source": f"lib/mod{f}.py", "prompt_ids": [base % 500] * 12,
                         "response_ids": [(base + i) % 500 for i in range(20)]})
    return rows


def _write(path: Path, rows: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_no_source_is_both_held_out_and_trained(tmp_path: Path):
    examples = read_examples(_write(tmp_path / "d.jsonl", _rows(10, 3)), max_length=64)
    assert {ex.source for ex in examples} == {f"source:lib/mod{f}.py" for f in range(10)}
    split = split_by_source(examples, held_out=4)
    held = {source_key(ex) for ex in split.held_out}
    trained = {source_key(ex) for ex in split.train}
    assert held and trained and not held & trained
    assert len(split.held_out) == 6 and len(split.train) == 24  # two whole files of three
    assert (split.held_out_sources, split.train_sources) == (2, 8)
    # The rule it replaces, the file's last rows, puts a held-out file in training too.
    old = {source_key(ex) for ex in examples[-4:]}
    assert old & {source_key(ex) for ex in examples[:-4]}


def test_rows_without_a_source_are_grouped_by_their_prompt():
    same = [Example((7,) * 4 + (i, i + 1), (0,) * 4 + (1, 1)) for i in range(3)]
    others = [Example((i,) * 4 + (9, 9), (0,) * 4 + (1, 1)) for i in range(20, 30)]
    split = split_by_source(same + others, held_out=2)
    by_prompt = {prompt_of(ex) for ex in split.held_out}
    assert not by_prompt & {prompt_of(ex) for ex in split.train}
    assert sum(ex in split.held_out for ex in same) in (0, 3)  # never split up
    # plain text (loss on every token): each row its own source
    text = [Example(tuple(range(i, i + 8)), (1,) * 8) for i in range(6)]
    assert len({source_key(ex) for ex in text}) == 6


def test_prompt_ids_name_sources_too_and_a_bad_one_is_one_line(tmp_path: Path):
    rows = [{"prompt_id": i // 2, "prompt_ids": [1, 2, 3], "response_ids": [4] * 9}
            for i in range(6)]
    examples = read_examples(_write(tmp_path / "ids.jsonl", rows), max_length=64)
    assert [ex.source for ex in examples] == ["prompt_id:0"] * 2 + ["prompt_id:1"] * 2 + [
        "prompt_id:2"] * 2
    bad = _write(tmp_path / "bad.jsonl", [rows[0], {**rows[1], "source": ["a"]}])
    with pytest.raises(DataError) as err:
        read_examples(bad, max_length=64)
    assert str(err.value) == (f"{bad}:2: 'source' must be a non-empty string or an int, "
                              "got ['a']")


def test_one_source_only_leaves_nothing_to_train_on(tmp_path: Path, tiny_target):
    data = _write(tmp_path / "one.jsonl", _rows(1, 8))
    cfg = dataclasses.replace(tiny(), out=str(tmp_path / "run"), data=str(data), **SMALL)
    with pytest.raises(ConfigError, match=r"1 source\(s\) leave none to train on"):
        Trainer(cfg, target=tiny_target)


def test_the_trainer_holds_out_whole_files_of_a_data_file(tmp_path: Path, tiny_target):
    data = _write(tmp_path / "d.jsonl", _rows(12, 3))
    cfg = dataclasses.replace(tiny(), out=str(tmp_path / "run"), data=str(data), **SMALL)
    trainer = Trainer(cfg, target=tiny_target)
    source = {ex.input_ids: ex.source for ex in read_examples(data, max_length=64)}
    held = {source[ex.input_ids] for ex in trainer.held_out}
    trained = {source[ids] for ids, _ in trainer.state.loader._rows}  # what batches are cut from
    assert held and trained and not held & trained
    assert trainer.split["held_out_rows"] == 6 and trainer.split["train_rows"] == 30
    assert trainer.split["held_out_sources"] == 2 and trainer.split["train_sources"] == 10
    # the decode prompts are the held-out files' prompts, one a file
    assert len(trainer.decode_prompts) == 2
    assert set(trainer.decode_prompts) <= {prompt_of(ex) for ex in trainer.held_out}


def test_generate_keeps_each_prompts_source(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    from dflash.cli.generate import main

    prompts = _write(tmp_path / "p.jsonl", [
        {"source": "a.py", "prompt_ids": [5, 6, 7]}, {"prompt_id": 3, "prompt_ids": [8, 9]},
        {"prompt_ids": [10, 11]}])
    out = tmp_path / "data.jsonl"
    assert main(["--target", "tiny", "--prompts", str(prompts), "--out", str(out),
                 "--max-new-tokens", "4", "--quiet"]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r.get("source") for r in rows] == ["a.py", None, None]
    assert [r.get("prompt_id") for r in rows] == [None, 3, None]
    assert [ex.source for ex in read_examples(out, max_length=64)] == [
        "source:a.py", "prompt_id:3", None]


def _train(tmp_path: Path, target, **changes) -> tuple[Trainer, list[dict]]:
    cfg = dataclasses.replace(tiny(), out=str(tmp_path), steps=4, **{**SMALL, **changes})
    trainer = Trainer(cfg, target=target)
    records: list[dict] = []
    trainer.run(records.append)
    return trainer, records


def test_training_measures_a_decoding_tau_beside_the_teacher_forced_one(tmp_path: Path,
                                                                         tiny_target):
    trainer, records = _train(tmp_path, tiny_target, held_out_decode_tokens=16)
    evals = [r for r in records if "held_out_tau" in r]
    assert [r["step"] for r in evals] == [2, 4]
    for r in evals:
        assert r["held_out_decode_tau"] >= 1.0
        assert r["held_out_tau_ratio"] == pytest.approx(r["held_out_tau"]
                                                        / r["held_out_decode_tau"])
    # the same figure as the decoding code gives the final drafter on those prompts
    assert len(trainer.decode_prompts) == 4
    again = decode_counts(tiny_target, trainer.drafter, trainer.decode_prompts,
                          max_new_tokens=16)
    assert evals[-1]["held_out_decode_tau"] == pytest.approx(pooled_tau(again))
    # ... with its bootstrap interval over those prompts beside it
    lo, hi = tau_interval(again)
    assert (evals[-1]["held_out_decode_tau_lo"], evals[-1]["held_out_decode_tau_hi"]) == (lo, hi)
    assert lo <= evals[-1]["held_out_decode_tau"] <= hi
    # held_out_tau is decoding replayed on the held-out rows over the decode's 16 tokens
    # (dflash.replay); the random-anchor mean is still logged beside it
    walked = replay(tiny_target, trainer.drafter,
                    [(ex.input_ids, len(prompt_of(ex))) for ex in trainer.held_out],
                    window=16, batch_size=4)
    assert evals[-1]["held_out_tau"] == walked.tau
    assert evals[-1]["held_out_tau_stopped"] == walked.stopped == 0
    assert all(r["held_out_tau_random"] >= 1.0 for r in evals)
    # the held-out rows are the target's greedy output, one a source, and the decoded
    # prompts are theirs: teacher forced and free running are the same walk
    assert {prompt_of(ex) for ex in trainer.held_out} == set(trainer.decode_prompts)
    assert evals[-1]["held_out_tau"] == pytest.approx(evals[-1]["held_out_decode_tau"])
    assert evals[-1]["held_out_tau_ratio"] == pytest.approx(1.0)


def test_the_held_out_decode_on_the_static_cycle_counts_as_the_eager_one(tmp_path: Path,
                                                                         tiny_target):
    """``held_out_decode_cycle=static`` (uncaptured on a CPU: the same fixed shapes) gives
    the eager decode's accepted tokens and cycles, prompt by prompt, and so its τ."""
    trainer, records = _train(tmp_path, tiny_target, held_out_decode_tokens=24,
                              held_out_decode_cycle="static")
    eager = decode_counts(tiny_target, trainer.drafter, trainer.decode_prompts,
                          max_new_tokens=24, path="eager")
    on_static = decode_counts(tiny_target, trainer.drafter, trainer.decode_prompts,
                              max_new_tokens=24, path="static")
    assert on_static == eager and len(eager) == 4
    assert records[-1]["held_out_decode_tau"] == pytest.approx(pooled_tau(eager))
    assert pooled_tau(eager) > 1.0  # drafts were accepted: a cycle's length was compared


def test_the_held_out_decode_is_captured_by_default_only_where_it_can_be(tiny_target):
    """``auto`` by default: the static cycle on dflash's own Qwen3 on a GPU (measured there:
    about 6 s an evaluation against 28-87 s eager), the eager loop on a CPU."""
    cfg = tiny()
    assert cfg.held_out_decode_cycle == "auto"
    assert decode_path(cfg, tiny_target) == "eager"  # a CPU: nothing to capture


def test_a_static_held_out_decode_the_target_cannot_run_is_refused_before_training(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from dflash.target import load_target

    monkeypatch.setenv("DFLASH_TARGET_BACKEND", "transformers")
    target = load_target("tiny", seed=0)
    cfg = dataclasses.replace(tiny(), out=str(tmp_path), steps=4,
                              **{**SMALL, "held_out_decode_cycle": "static"})
    with pytest.raises(ConfigError, match="held_out_decode_cycle: the static cycle runs "
                                          "dflash's own Qwen3 targets only"):
        Trainer(cfg, target=target)
    assert decode_path(dataclasses.replace(cfg, held_out_decode_cycle="auto"), target) == "eager"
    with pytest.raises(ConfigError, match="held_out_decode_cycle must be one of auto, eager, "
                                          "static"):
        dataclasses.replace(cfg, held_out_decode_cycle="captured")


def test_an_evaluation_step_is_logged_whatever_log_every_says(tmp_path: Path, tiny_target):
    """eval_every need not be a multiple of log_every: 3 and 2 evaluate at step 3 (a
    record of its own), where only steps both divide once did (none before step 6). The
    last step (4) is evaluated too, so the run's last held-out figures are its export's."""
    _, records = _train(tmp_path, tiny_target, log_every=2, eval_every=3,
                        held_out_decode_tokens=8)
    assert [r["step"] for r in records] == [2, 3, 4]
    assert ["held_out_tau" in r for r in records] == [False, True, True]


@pytest.mark.parametrize("log_every", [7, 1])
def test_a_time_budget_ends_the_run_as_its_last_step_does(tmp_path: Path, tiny_target,
                                                          log_every: int):
    """``max_seconds`` ends the loop at a step boundary: that step is logged with a held-out
    evaluation (eval_every lies far beyond it), then a checkpoint and the export, as at
    ``steps``; the schedule was still planned for ``steps``. With ``log_every=1`` the budget
    always ends on a step already logged: that record is written again with the held-out
    figures, and the one handed out before is left as it was."""
    cfg = dataclasses.replace(tiny(), out=str(tmp_path), steps=100_000, max_seconds=1.5,
                              **{**SMALL, "log_every": log_every, "eval_every": 50_000,
                                 "held_out_decode_tokens": 8})
    trainer = Trainer(cfg, target=tiny_target)
    records: list[dict] = []
    started = time.perf_counter()
    result = trainer.run(records.append)
    assert time.perf_counter() - started < 60
    assert result.timed_out and not result.stopped_early
    assert 0 < result.step < cfg.steps
    assert result.export is not None and (result.export / "config.json").is_file()
    assert result.checkpoint is not None and result.checkpoint.name.endswith(f"{result.step:08d}")
    assert records[-1]["step"] == result.step and "held_out_decode_tau" in records[-1]
    assert result.held_out["step"] == result.step
    assert [r for r in records if "held_out_tau" in r] == [records[-1]]
    if log_every == 1:
        assert records[-2]["step"] == result.step and records[-2] is not records[-1]
    assert records[-1]["lr"] > 0  # stopped mid-schedule: the learning rate had not decayed


def test_a_negative_time_budget_is_refused():
    with pytest.raises(ConfigError, match="max_seconds must be >= 0"):
        dataclasses.replace(tiny(), max_seconds=-1.0)


def test_the_window_is_the_decode_length_unless_set(tmp_path: Path, tiny_target):
    cfg = dataclasses.replace(tiny(), held_out_decode_tokens=24)
    assert window_of(cfg) == 24
    assert window_of(dataclasses.replace(cfg, held_out_window=128)) == 128
    with pytest.raises(ConfigError, match="held_out_window must be >= 0"):
        dataclasses.replace(cfg, held_out_window=-1)
    trainer, records = _train(tmp_path, tiny_target, held_out_window=8,
                              held_out_decode_prompts=0)
    walked = replay(tiny_target, trainer.drafter,
                    [(ex.input_ids, len(prompt_of(ex))) for ex in trainer.held_out],
                    window=8, batch_size=4)
    assert records[-1]["held_out_tau"] == walked.tau
    assert "held_out_decode_tau" not in records[-1]


def test_no_decoding_with_zero_prompts(tmp_path: Path, tiny_target):
    trainer, records = _train(tmp_path, tiny_target, held_out_decode_prompts=0)
    evals = [r for r in records if "held_out_tau" in r]
    assert evals and not any("held_out_decode_tau" in r for r in evals)
    assert trainer.decode_prompts == []


def test_the_final_report_says_how_far_apart_they_are(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]):
    from dflash.cli.train import main

    out = tmp_path / "run"
    argv = ["--preset", "tiny", "--unguarded", "--quiet", "--out", str(out), "--steps", "4",
            "--set=eval_every=4", "--heldout-decode-prompts", "2",
            *[a for a in launch.SMALL if "eval_every" not in a]]
    assert main(argv) == 0
    held = json.loads((out / "metadata.json").read_text())["held_out"]
    assert held["decode_prompts"] == 2 and held["step"] == 4
    assert held["ratio"] == pytest.approx(held["teacher_forced_tau"] / held["decode_tau"])
    assert held["window"] == held["decode_tokens"] == 32 and held["stopped_rows"] >= 0
    assert held["teacher_forced_tau_random"] >= 1.0
    assert held["held_out_rows"] >= 4 and held["train_rows"] > held["held_out_rows"]
    line = next(x for x in capsys.readouterr().out.splitlines() if "held-out τ at" in x)
    lo, hi = held["decode_tau_interval"]
    assert lo <= held["decode_tau"] <= hi
    assert line == (f"dflash-train: held-out τ at step 4: {held['teacher_forced_tau']:.2f} "
                    f"teacher-forced, {held['decode_tau']:.2f} decoding "
                    f"(ratio {held['ratio']:.2f}; decoding {lo:.2f}-{hi:.2f} over its 2 "
                    "prompts, 95 % bootstrap)")


def test_decode_prompts_are_one_per_held_out_source():
    rows = [Example((s,) * 3 + (1, 2, 3, 4), (0, 0, 0, 1, 1, 1, 1), source=f"f{s % 3}")
            for s in range(9)]
    prompts = decode_prompts(rows, 5)
    assert len(prompts) == 3  # three sources
    assert len({p for p in prompts}) == 3


@pytest.mark.slow
def test_under_torchrun_rank_0_decodes_with_the_gathered_drafter(tmp_path: Path):
    out = tmp_path / "run"
    proc = launch.torchrun(2, "-m", "dflash.cli.train", *launch.train_args(out, 4),
                           "--set=eval_every=2", "--set=save_every=0", fresh=out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in records if "held_out_tau" in r]
    assert [r["step"] for r in evals] == [2, 4]
    assert all(r["held_out_decode_tau"] >= 1.0 for r in evals), evals


def test_dflash_train_says_the_time_budget_ended_it(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]):
    from dflash.cli.train import main

    out = tmp_path / "run"
    argv = ["--preset", "tiny", "--unguarded", "--quiet", "--out", str(out), "--steps",
            "100000", "--set=max_seconds=1", "--heldout-decode-prompts", "2",
            "--set=eval_every=50000", *[a for a in launch.SMALL if "eval_every" not in a]]
    assert main(argv) == 0
    held = json.loads((out / "metadata.json").read_text())["held_out"]
    said = capsys.readouterr().out
    done = re.search(r"dflash-train: done at step (\d+) \(1 s, max_seconds\); drafter in (.+)",
                     said)
    assert done is not None, said
    assert held["step"] == int(done[1]) and Path(done[2]) == out / "drafter"
    assert f"held-out τ at step {done[1]}:" in said
