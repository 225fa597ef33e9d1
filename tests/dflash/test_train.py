"""The training loop, end to end on CPU: it learns, it resumes exactly, SIGTERM is clean."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import pytest
import torch

from dflash.checkpoint.export import load_drafter
from dflash.checkpoint.layout import latest_checkpoint
from dflash.errors import InputError
from dflash.meter import MetricsLog
from dflash.presets import tiny
from dflash.train import Trainer
from tests.dflash import launch

SMALL = {"steps": 10, "log_every": 1, "save_every": 0, "eval_every": 0,
         "synthetic_prompts": 40, "synthetic_response_tokens": 40, "held_out": 4,
         "batch_size": 4, "buckets": (64,), "anchors": 8, "peak_tflops": 1.0}


def test_tiny_preset_learns(trained_tiny):
    first, last = trained_tiny.records[0], trained_tiny.records[-1]
    assert last["step"] == tiny().steps
    assert last["loss"] < 0.7 * first["loss"], (first["loss"], last["loss"])
    evals = [r for r in trained_tiny.records if "held_out_tau" in r]
    assert evals, "the tiny preset evaluates held-out tau"
    held = [r["held_out_tau_random"] for r in evals]
    # Untrained drafters accept nothing (tau 1); a clear margin, not noise. The held-out
    # rows are whole sources picked by hash (dflash.heldout): 1.30 at the end here, where
    # the file's last 16 rows read 1.39 (CPU, torch 2.13).
    assert trained_tiny.untrained_tau < 1.2
    assert held[-1] > trained_tiny.untrained_tau + 0.2, (trained_tiny.untrained_tau, held)
    decoded = [r["held_out_decode_tau"] for r in evals]
    assert decoded[-1] > 1.0, decoded
    # Decoding replayed on the held-out rows (32 tokens after each prompt) reads what
    # decoding does, below the random-anchor mean: 1.16 against 1.30 here.
    walked = [r["held_out_tau"] for r in evals]
    assert 1.0 < walked[-1] < held[-1], (walked, held)
    for key in ("acc", "tau_sim", "grad_norm", "lr", "ctx_tok_s", "draft_tok_s", "mfu"):
        assert key in last
    assert len(last["acc"]) == tiny().block_size - 1


def test_export_loads_where_drafters_load(trained_tiny):
    export = trained_tiny.result.export
    config = json.loads((export / "config.json").read_text())
    assert config["architectures"] == ["DFlashDraftModel"]
    assert config["dflash_config"]["target_layer_ids"] == [1, 3, 5]
    loaded = load_drafter(export)
    for name, tensor in trained_tiny.drafter.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[name], tensor.float())


def test_frozen_parts_get_no_gradient(tiny_target, tmp_path: Path):
    cfg = dataclasses.replace(tiny(), out=str(tmp_path), **SMALL)
    trainer = Trainer(cfg, target=tiny_target)
    batch = trainer.state.loader.next_batch()
    out, _ = trainer.forward_loss(batch.input_ids_BS, batch.loss_mask_BS,
                                  trainer.state.anchor_gen)
    out.loss.backward()
    assert all(p.grad is None for p in tiny_target.model.parameters())
    grads = [p.grad for p in trainer.drafter.parameters()]
    assert all(g is not None for g in grads) and any(g.abs().sum() > 0 for g in grads)


def test_the_held_out_evaluation_never_calls_the_compiled_kernel(tiny_target, tmp_path: Path):
    """A no-grad call of the compiled flex kernel is a graph of its own: compiled in every
    start's warm-up, or refused after the seal (``fail_on_recompile``). The held-out
    evaluation attends densely instead, with the same loss to rounding. CPU has no flex
    backward, so the trainer is made as on a GPU afterwards: flex attention whose
    compiled handle fails if called."""
    from dflash.compilation.kernels import Kernels
    from dflash.masks import flex_attention

    cfg = dataclasses.replace(tiny(), out=str(tmp_path), **SMALL)
    trainer = Trainer(cfg, target=tiny_target)
    dense_tau = trainer.held_out_tau_random()
    calls: list[int] = []

    def compiled_flex(*args, **kwargs):
        calls.append(1)
        raise AssertionError("the compiled flex kernel ran without gradients")

    trainer.rt = dataclasses.replace(trainer.rt, attention="flex")
    trainer.kernels = Kernels(flex=compiled_flex, block_mask_builder=compiled_flex,
                              compiled=True)
    assert trainer.held_out_tau_random() == dense_tau
    assert not calls
    with pytest.raises(AssertionError, match="without gradients"):  # the training path does
        batch = trainer.state.loader.next_batch()
        trainer.forward_loss(batch.input_ids_BS, batch.loss_mask_BS, trainer.state.anchor_gen)
    trainer.kernels = Kernels(flex=flex_attention, block_mask_builder=compiled_flex,
                              compiled=False)
    batch = trainer.state.loader.next_batch()
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.filterwarnings("ignore", "flex_attention called without torch.compile")
        flex_out, _ = trainer.forward_loss(batch.input_ids_BS, batch.loss_mask_BS, gen)
        dense_out, _ = trainer.forward_loss(batch.input_ids_BS, batch.loss_mask_BS,
                                            torch.Generator().manual_seed(5), dense=True)
    torch.testing.assert_close(flex_out.loss, dense_out.loss, rtol=1e-4, atol=1e-5)


def _run(cfg, target, stop_at: int | None = None):
    trainer = Trainer(cfg, target=target)
    stop = threading.Event()
    seen: list[dict] = []

    def on_log(record: dict) -> None:
        seen.append(record)
        if stop_at is not None and record["step"] == stop_at:
            stop.set()

    return trainer, trainer.run(on_log, stop), seen


def test_resume_matches_an_uninterrupted_run(tiny_target, tmp_path: Path):
    full_cfg = dataclasses.replace(tiny(), out=str(tmp_path / "full"), **SMALL)
    _, full, full_log = _run(full_cfg, tiny_target)
    assert full.step == 10 and not full.stopped_early

    cut_cfg = dataclasses.replace(full_cfg, out=str(tmp_path / "cut"))
    _, cut, cut_log = _run(cut_cfg, tiny_target, stop_at=4)
    assert cut.stopped_early and cut.step == 4 and cut.export is None
    ckpt = latest_checkpoint(tmp_path / "cut")
    assert ckpt is not None and ckpt.name.endswith("00000004")

    # As if the cut run had logged steps 5 and 6 past its checkpoint and then been killed
    # mid-line: the resumed run logs them again, once.
    metrics = tmp_path / "cut" / "metrics.jsonl"
    logged = metrics.read_text()
    metrics.write_text(logged + '{"step": 5, "loss": 1.0}\n{"step": 6, "loss": 1.0}\n{"st')
    resumed = Trainer(cut_cfg, target=tiny_target)
    resumed.resume(ckpt)
    tail: list[dict] = []
    resumed.run(tail.append)
    assert [r["step"] for r in tail] == list(range(5, 11))
    assert [json.loads(line)["step"] for line in metrics.read_text().splitlines()
            ] == list(range(1, 11))
    assert metrics.read_text().startswith(logged)
    expected = {r["step"]: r for r in full_log}
    for r in cut_log + tail:
        assert r["loss"] == pytest.approx(expected[r["step"]]["loss"], rel=1e-5, abs=1e-6)
        assert r["grad_norm"] == pytest.approx(expected[r["step"]]["grad_norm"], rel=1e-4)
    for name, t in resumed.drafter.state_dict().items():
        torch.testing.assert_close(t, load_drafter(full.export).state_dict()[name])


def _cli(out: Path, *extra: str, quiet: bool = True) -> list[str]:
    sets = [f"--set={k}={v}" for k, v in SMALL.items() if k not in ("steps", "buckets")]
    return [sys.executable, "-m", "dflash.cli.train", "--preset", "tiny", "--unguarded",
            *(["--quiet"] if quiet else []), "--out", str(out), "--set=buckets=64", *sets,
            *extra]


@pytest.mark.slow
def test_sigterm_saves_a_checkpoint_and_resume_finishes(tmp_path: Path):
    out = tmp_path / "run"
    env = {**launch.env(), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(_cli(out, "--steps", "100000"), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)  # --quiet
    metrics = out / "metrics.jsonl"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and proc.poll() is None:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= 3:
            break
        time.sleep(0.2)
    assert proc.poll() is None, proc.communicate()
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr
    assert "stopped by SIGTERM" in stdout
    assert "dflash-train: building" not in stderr  # --quiet: no start phases either
    ckpt = latest_checkpoint(out)
    assert ckpt is not None
    step = int(ckpt.name.split("-")[-1])
    assert step >= 3

    done = subprocess.run(_cli(out, "--resume", "--steps", str(step + 3)),
                          capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr
    assert f"resuming from {ckpt}" in done.stdout
    assert f"done at step {step + 3}" in done.stdout
    assert (out / "drafter" / "model.safetensors").exists()
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["torch"]["git"] and meta["unguarded"] in (True, False)


PHASE_END = re.compile(r"^dflash-train: (.+): \d+\.\d s$")


@pytest.mark.slow
def test_warmup_only_says_each_start_phase_and_compiles_nothing_it_does_not_need(
        tmp_path: Path):
    # Piped (not a terminal): one plain line on stderr as each start phase begins and one
    # with its time when it ends; a warm-up-only run generates no data.
    ok = subprocess.run(_cli(tmp_path / "w", "--warmup-only", quiet=False),
                        capture_output=True, text=True, timeout=300, env=launch.env())
    assert ok.returncode == 0, ok.stderr
    assert "warm-up done" in ok.stdout
    assert not (tmp_path / "w" / "checkpoints").exists()
    lines = [line for line in ok.stderr.splitlines() if line.startswith("dflash-train: ")]
    begun = [line.removeprefix("dflash-train: ").removesuffix("...") for line in lines
             if line.endswith("...")]
    ended = [m.group(1) for m in map(PHASE_END.match, lines) if m]
    assert begun == ended, ok.stderr
    assert [text.split(" (")[0] for text in begun] == [
        "building the target", "building the drafter", "placing the drafter on cpu",
        "making random batches of every shape", "warm-up"], ok.stderr
    assert len(lines) == 2 * len(begun), ok.stderr  # nothing else, and no generation
    meta = json.loads((tmp_path / "w" / "metadata.json").read_text())
    assert list(meta["start_s"]) == ["target", "drafter", "parallelize", "data", "warmup"]


@pytest.mark.parametrize("extra", [["--set", "steps=many"], ["--set", "no_such_key=1"],
                                   ["--set", "buckets=2"], ["--data", "missing.jsonl"]])
def test_bad_input_is_one_line_exit_2(tmp_path: Path, capsys, extra: list[str], tiny_target):
    from dflash.cli.train import main

    assert main(_cli(tmp_path / "b", *extra)[3:]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err


def test_the_metrics_log_keeps_the_steps_before_its_start_and_reads_no_fifo(tmp_path: Path):
    """A run from step 0 starts metrics.jsonl empty; one resumed at step 2 keeps steps 1-2
    (and a line without a step is dropped as torn); a FIFO is refused at once."""
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": s}) + "\n" for s in (1, 2, 3))
                    + '{"loss": 1}\n[1]\n{"step": true}\n')
    log = MetricsLog(path, after=2)
    log.write({"step": 3, "loss": 0.5})
    log.close()
    assert [json.loads(line) for line in path.read_text().splitlines()] == [
        {"step": 1}, {"step": 2}, {"step": 3, "loss": 0.5}]
    MetricsLog(path).close()
    assert path.read_text() == ""
    fifo = tmp_path / "fifo.jsonl"
    os.mkfifo(fifo)
    started = time.perf_counter()
    with pytest.raises(InputError, match=r"fifo\.jsonl: .*FIFO"):
        MetricsLog(fifo, after=3)
    assert time.perf_counter() - started < 5


@pytest.mark.parametrize("log_every", [1, 3])
def test_a_run_whose_loss_goes_nan_stops_and_saves_nothing_after(tiny_target, tmp_path: Path,
                                                                  log_every: int):
    """From step 5 the gradient norm reads NaN (as it does once weights or inputs are): the
    run stops with a RunError naming the step, at the log point or at the save that comes
    first, so no checkpoint, metrics line or export holds what came after."""
    from dflash.errors import RunError

    cfg = dataclasses.replace(tiny(), out=str(tmp_path), **{
        **SMALL, "steps": 12, "log_every": log_every, "save_every": 2})
    trainer = Trainer(cfg, target=tiny_target)
    real = trainer.train_step

    def failing(*args, **kwargs):
        step = real(*args, **kwargs)
        if trainer.state.step >= 5:
            return dataclasses.replace(step, grad_norm=step.grad_norm * float("nan"))
        return step

    trainer.train_step = failing  # type: ignore[method-assign]
    records: list[dict] = []
    with pytest.raises(RunError, match=r"the training diverged by step (5|6): the loss or the "
                                       r"gradient norm is NaN or infinite"):
        trainer.run(records.append)
    assert all(r["step"] < 5 for r in records)
    assert latest_checkpoint(tmp_path).name == "step-00000004"
    assert not (tmp_path / "drafter").exists()
