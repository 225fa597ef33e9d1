"""The trainer's start phases: timed and told to a listener, the same CPU build as
before, fast synthetic data on a GPU, and no data generated for a warm-up-only run."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from dflash.decoding import generate
from dflash.model import DFlashDrafter
from dflash.presets import qwen3_8b_shape, tiny, tiny_drafter
from dflash.startup import build_drafter, generation_batch, synthetic_examples
from dflash.target import load_target
from dflash.train import Trainer

SMALL = {"steps": 2, "synthetic_prompts": 24, "synthetic_response_tokens": 24, "held_out": 2,
         "batch_size": 2, "buckets": (64,), "anchors": 4, "peak_tflops": 1.0}


class Heard:
    """A start-phase listener that keeps what it heard: (begin|end, phase, seconds) in
    order, and each phase's text."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str, float | None]] = []
        self.texts: dict[str, str] = {}

    def begin(self, phase: str, text: str) -> None:
        self.events.append(("begin", phase, None))
        self.texts[phase] = text

    def end(self, phase: str, text: str, seconds: float) -> None:
        self.events.append(("end", phase, seconds))


def test_each_phase_is_timed_and_heard_in_order(tmp_path: Path):
    heard = Heard()
    cfg = dataclasses.replace(tiny(), out=str(tmp_path), **SMALL)
    trainer = Trainer(cfg, on_phase=heard)
    trainer.warmup()
    phases = ["target", "drafter", "parallelize", "data", "warmup"]
    assert [(kind, phase) for kind, phase, _ in heard.events] == [
        (kind, p) for p in phases for kind in ("begin", "end")]
    assert list(trainer.start_phases) == phases
    assert all(s is None or s >= 0 for _, _, s in heard.events)
    assert trainer.peak_tflops() == 1.0 and "peak" not in trainer.start_phases


def test_the_cpu_build_and_data_are_what_they_were(tiny_target):
    # The drafter made on its device is, on CPU, the build from the same random stream;
    # the synthetic data keeps the 64-prompt batches of the decoding module's own path.
    torch.manual_seed(3)
    made = build_drafter(tiny_drafter(), torch.device("cpu"))
    torch.manual_seed(3)
    before = DFlashDrafter(tiny_drafter())
    for (name, a), (_, b) in zip(made.state_dict().items(), before.state_dict().items(),
                                 strict=True):
        assert torch.equal(a, b), name
    cfg = dataclasses.replace(tiny(), synthetic_prompts=80, synthetic_response_tokens=12)
    assert generation_batch(tiny_target, cfg) == 64
    assert synthetic_examples(tiny_target, cfg) == generate.synthetic_examples(tiny_target, cfg)


def test_a_gpu_generates_in_batches_a_memory_budget_holds():
    target = load_target("qwen3-8b-shape", device="meta", dtype=torch.bfloat16)
    cfg = qwen3_8b_shape()
    # 112 tokens x 144 KiB of KV each, plus the last position's fp32 + bf16 logits (the
    # prefill keeps no others): 16 GiB holds 985 prompts, so the default 512 need one
    # decode loop (two when the prefill kept [B, 16, V] logits, eight at 64 a batch).
    assert generation_batch(target, cfg) == 512
    assert generation_batch(target, dataclasses.replace(cfg, synthetic_prompts=4096)) == 985
    assert generation_batch(target, dataclasses.replace(cfg, synthetic_prompts=100)) == 100


def test_warmup_only_makes_every_shape_without_generating(tiny_target, tmp_path: Path):
    cfg = dataclasses.replace(tiny(), out=str(tmp_path), **{**SMALL, "buckets": (64, 128)})
    trainer = Trainer(cfg, target=tiny_target, shapes_only=True)
    assert trainer.state.loader.shapes() == [(2, 64), (2, 128)]
    assert len(trainer.held_out) == cfg.held_out
    batch = trainer.state.loader.next_batch()
    assert not (batch.input_ids_BS == tiny_target.mask_token_id).any()


def test_each_checkpoint_names_the_environment_snapshot(tiny_target, tmp_path: Path):
    from dflash.checkpoint.local import read_trainer_state

    cfg = dataclasses.replace(tiny(), out=str(tmp_path), **SMALL)
    trainer = Trainer(cfg, target=tiny_target)
    assert "environment" not in read_trainer_state(trainer.save())
    trainer.environment = {"file": "env.json", "sha256": "sha256:" + "ab" * 32}
    state = read_trainer_state(trainer.save())
    assert state["environment"] == trainer.environment


def test_the_matmul_peak_is_measured_once_per_gpu_model(tmp_path: Path, monkeypatch):
    """No GPU here: the device name and the measurement are stand-ins (said so), the
    memo file and its reading are real."""
    from dflash import meter

    calls: list[str] = []

    def measure(device, dtype):
        calls.append(str(device))
        return 700.0 + len(calls)

    monkeypatch.setattr(meter, "measure_matmul_tflops", measure)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    cuda = torch.device("cuda")
    assert meter.remembered_peak(cuda, torch.bfloat16, tmp_path) == 701.0
    assert meter.remembered_peak(cuda, torch.bfloat16, tmp_path) == 701.0  # remembered
    assert meter.remembered_peak(cuda, torch.float32, tmp_path) == 702.0  # another dtype
    assert len(calls) == 2
    (tmp_path / "peaks.json").write_text("{not json")
    assert meter.remembered_peak(cuda, torch.bfloat16, tmp_path) == 703.0  # measured again
    assert meter.remembered_peak(torch.device("cpu"), torch.float32, tmp_path) == 704.0
    assert meter.remembered_peak(torch.device("cpu"), torch.float32, tmp_path) == 705.0
    blocked = tmp_path / "file"
    blocked.write_text("")
    assert meter.remembered_peak(cuda, torch.bfloat16, blocked / "sub") == 706.0  # no folder


def test_generated_data_is_kept_and_read_back_by_a_later_start(tiny_target, tmp_path: Path,
                                                               monkeypatch):
    from dflash import dataphase, startup

    cfg = dataclasses.replace(tiny(), synthetic_prompts=12, synthetic_response_tokens=10)
    batch = startup.generation_batch(tiny_target, cfg)
    path = startup.remembered_path(cfg, tiny_target, tmp_path, batch)
    first = startup.remembered_examples(tiny_target, cfg, path)
    assert first == synthetic_examples(tiny_target, cfg)
    assert path.is_file()
    kept = dataphase.data_source(cfg, given=False, shapes_only=False, remembered=path)
    assert kept == "kept" and "generated before" in dataphase.data_text(cfg, kept, path)

    def no_generation(*args, **kwargs):
        raise AssertionError("generated again")

    monkeypatch.setattr(startup, "synthetic_examples", no_generation)
    assert startup.remembered_examples(tiny_target, cfg, path) == first  # read back
    # Another recipe or seed is another key, so it generates.
    for other in (dataclasses.replace(cfg, seed=1), dataclasses.replace(cfg, synthetic_prompts=13)):
        assert startup.remembered_path(other, tiny_target, tmp_path, batch) != path
    # So is another generation batch (greedy rows batched otherwise may differ in the last bit).
    assert startup.remembered_path(cfg, tiny_target, tmp_path, batch + 1) != path
    monkeypatch.undo()
    path.write_text('{"input_ids": [1, 2]\n')  # a torn file: generated and written again
    assert startup.remembered_examples(tiny_target, cfg, path) == first
    assert startup.remembered_examples(tiny_target, cfg, tmp_path / "no" / "such.jsonl") == first



def test_generated_data_is_kept_only_where_no_other_user_can_write(tiny_target, tmp_path: Path):
    """A cache folder others may write (DFLASH_CACHE_DIR on a shared disk) could hold data
    planted to be trained on: it is neither read nor written; the start generates."""
    from dflash import startup

    cfg = dataclasses.replace(tiny(), synthetic_prompts=12, synthetic_response_tokens=10)
    batch = startup.generation_batch(tiny_target, cfg)
    private = startup.remembered_path(cfg, tiny_target, tmp_path / "mine", batch)
    assert private is not None and private.parent.stat().st_mode & 0o777 == 0o700  # made so
    shared = tmp_path / "shared"
    (shared / "synthetic").mkdir(parents=True)
    (shared / "synthetic").chmod(0o777)
    assert startup.remembered_path(cfg, tiny_target, shared, batch) is None
    above = tmp_path / "above"  # a private folder under one others may write (not sticky):
    (above / "synthetic").mkdir(parents=True, mode=0o700)  # anyone could swap it
    above.chmod(0o777)
    assert startup.remembered_path(cfg, tiny_target, above, batch) is None
    above.chmod(0o755)  # (decided once a process: a fresh folder shows the same rule)
    fine = tmp_path / "fine"
    (fine / "synthetic").mkdir(parents=True, mode=0o700)
    assert startup.remembered_path(cfg, tiny_target, fine, batch) is not None
