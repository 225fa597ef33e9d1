"""The data phase beside the drafter's placing (:class:`dflash.dataphase.DataPhase`).

On a GPU the target's decode loop for the synthetic data runs in a thread while the main
thread places the drafter. No GPU here: the tests run the same thread on the CPU (the
choice of device is :func:`generates_beside`, tested by itself), with the tiny target's
real decode loop."""

from __future__ import annotations

import dataclasses
import threading
import time
from pathlib import Path

import pytest
import torch

from dflash import dataphase, startup
from dflash.dataphase import BESIDE_OPT_OUT_ENV, DataPhase, generates_beside
from dflash.errors import ConfigError
from dflash.presets import tiny
from dflash.startup import StartClock
from dflash.train import Trainer
from tests.dflash.test_startup import SMALL, Heard

CPU = torch.device("cpu")


def _phase(cfg, target, beside: bool, clock: StartClock | None = None, remembered=None):
    return DataPhase(clock or StartClock(CPU), cfg, target, examples=None, shapes_only=False,
                     ranks=1, remembered=remembered, beside=beside)


def test_beside_gives_the_split_in_turn_gives_and_times_both(tiny_target):
    cfg = dataclasses.replace(tiny(), **SMALL)
    in_turn = _phase(cfg, tiny_target, beside=False).result()
    clock = StartClock(CPU)
    phase = _phase(cfg, tiny_target, beside=True, clock=clock)
    assert phase.beside
    split = phase.result()
    assert split == in_turn
    assert list(clock.seconds) == ["data", "data_beside"]
    assert clock.seconds["data_beside"] > 0


def test_only_a_gpu_that_generates_goes_beside(monkeypatch):
    monkeypatch.delenv(BESIDE_OPT_OUT_ENV, raising=False)
    cuda = torch.device("cuda")  # a device object only: nothing runs on it
    assert generates_beside(cuda, True)
    assert not generates_beside(cuda, False)  # a data file, data kept before, warm-up only
    assert not generates_beside(CPU, True)
    monkeypatch.setenv(BESIDE_OPT_OUT_ENV, "1")
    assert not generates_beside(cuda, True)


def test_kept_data_and_a_data_file_are_read_in_turn(tiny_target, tmp_path: Path, monkeypatch):
    monkeypatch.delenv(BESIDE_OPT_OUT_ENV, raising=False)
    monkeypatch.setattr(dataphase, "generates_beside", lambda device, generating: generating)
    cfg = dataclasses.replace(tiny(), **SMALL)
    path = startup.remembered_path(cfg, tiny_target, tmp_path,
                                   startup.generation_batch(tiny_target, cfg))
    first = _phase(cfg, tiny_target, beside=None, remembered=path)
    assert first.beside  # generates (and keeps what it made)
    first.result()
    assert path.is_file()
    assert not _phase(cfg, tiny_target, beside=None, remembered=path).beside


def test_the_threads_error_is_the_phases_error(tiny_target):
    cfg = dataclasses.replace(tiny(), **{**SMALL, "held_out": 500})
    with pytest.raises(ConfigError) as in_turn:
        _phase(cfg, tiny_target, beside=False).result()
    heard = Heard()
    phase = _phase(cfg, tiny_target, beside=True, clock=StartClock(CPU, heard))
    with pytest.raises(ConfigError) as beside:
        phase.result()
    assert str(beside.value) == str(in_turn.value)
    assert [e[0] for e in heard.events] == ["begin"]  # a phase that raised is not ended


def test_a_failure_beside_it_lets_the_generation_end_first(tiny_target, monkeypatch):
    finished = threading.Event()

    def slow(*args, **kwargs):
        time.sleep(0.5)
        finished.set()
        raise RuntimeError("the generation's own error")

    monkeypatch.setattr(dataphase, "training_examples", slow)
    phase = _phase(dataclasses.replace(tiny(), **SMALL), tiny_target, beside=True)
    with pytest.raises(KeyError, match="placing"), phase.alongside():
        raise KeyError("placing")
    assert finished.is_set()  # waited for; its own error dropped for the placing's


def test_the_trainer_built_with_the_data_beside_is_the_same(tiny_target, tmp_path: Path,
                                                            monkeypatch):
    cfg = dataclasses.replace(tiny(), out=str(tmp_path), **SMALL)
    serial = Trainer(cfg, target=tiny_target)
    monkeypatch.setattr(dataphase, "generates_beside", lambda device, generating: generating)
    heard = Heard()
    beside = Trainer(cfg, target=tiny_target, on_phase=heard)
    assert beside.split == serial.split and beside.held_out == serial.held_out
    a, b = serial.state.loader.next_batch(), beside.state.loader.next_batch()
    assert torch.equal(a.input_ids_BS, b.input_ids_BS)
    assert torch.equal(a.loss_mask_BS, b.loss_mask_BS)
    assert [(kind, phase) for kind, phase, _ in heard.events] == [
        (kind, p) for p in ("drafter", "parallelize", "data") for kind in ("begin", "end")]
    assert "generates the data meanwhile" in heard.texts["parallelize"]
    assert "beside" in heard.texts["data"]
    assert list(beside.start_phases) == ["drafter", "parallelize", "data", "data_beside"]
    assert "data_beside" not in serial.start_phases


def test_the_data_source_is_found_in_the_order_the_examples_are_read(tmp_path: Path):
    kept = tmp_path / "kept.jsonl"
    kept.write_text("")
    with_file = dataclasses.replace(tiny(), data=str(tmp_path / "d.jsonl"))

    def source(cfg, *, given=False, shapes_only=False, remembered=None):
        return dataphase.data_source(cfg, given=given, shapes_only=shapes_only,
                                   remembered=remembered)

    assert source(with_file, given=True, shapes_only=True, remembered=kept) == "given"
    assert source(with_file, shapes_only=True, remembered=kept) == "file"
    assert source(tiny(), shapes_only=True, remembered=kept) == "shapes"
    assert source(tiny(), remembered=kept) == "kept"
    assert source(tiny(), remembered=tmp_path / "absent.jsonl") == "generate"
    assert source(tiny()) == "generate"
    assert "d.jsonl" in dataphase.data_text(with_file, "file")
    assert "12 prompts" in dataphase.data_text(dataclasses.replace(tiny(), synthetic_prompts=12),
                                             "generate")
