"""The warm-up (:mod:`dflash.warmup`), and the warm-up beside the data phase.

No GPU here: the trainer's warm-up runs eagerly on the CPU (nothing to compile), and the
data phase runs beside the placing in a thread, on the CPU too, with the tiny target's
real decode loop. What the choice of running beside depends on (a GPU, compiled kernels)
is tested by itself; the trainer is then made to take that path here."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from dflash import dataphase, train
from dflash.dataphase import DataPhase
from dflash.presets import tiny
from dflash.startup import StartClock, synthetic_shapes
from dflash.train import Trainer
from dflash.warmup import BESIDE_OPT_IN_ENV, warms_up_beside
from tests.dflash.test_startup import SMALL, Heard

CPU = torch.device("cpu")


class Features:
    """Counts the target's feature calls (the warm-up beside must make none)."""

    def __init__(self, target) -> None:
        self.real, self.calls = target.features, 0

    def __call__(self, ids):
        self.calls += 1
        return self.real(ids)


@pytest.fixture
def beside(monkeypatch):
    """The trainer takes the path a GPU with compiled kernels takes."""
    monkeypatch.setattr(dataphase, "generates_beside", lambda device, generating: generating)
    monkeypatch.setattr(train, "warms_up_beside", lambda data, compiled, alone: data.beside)


def test_the_synthetic_datas_shapes_are_known_before_it_is_made(tiny_target, tmp_path):
    for buckets in ((64,), (32, 48, 64, 128), (16,)):
        cfg = dataclasses.replace(tiny(), out=str(tmp_path), **{**SMALL, "buckets": buckets})
        made = Trainer(cfg, target=tiny_target).state.loader.shapes()
        assert synthetic_shapes(cfg) == made
    assert synthetic_shapes(dataclasses.replace(cfg, buckets=(32, 200))) == [(2, 200)]


def test_only_a_compiling_warm_up_in_one_process_asked_for_goes_beside(tiny_target,
                                                                      monkeypatch):
    monkeypatch.setenv(BESIDE_OPT_IN_ENV, "1")
    cfg = dataclasses.replace(tiny(), **SMALL)
    data = DataPhase(StartClock(CPU), cfg, tiny_target, examples=None, shapes_only=False,
                     ranks=1, remembered=None, beside=True)
    in_turn = DataPhase(StartClock(CPU), cfg, tiny_target, examples=None, shapes_only=False,
                        ranks=1, remembered=None, beside=False)
    assert warms_up_beside(data, True, True)
    assert not warms_up_beside(in_turn, True, True)
    assert not warms_up_beside(data, False, True)  # eager: nothing to compile
    assert not warms_up_beside(data, True, False)  # torchrun: every rank must warm up alike
    monkeypatch.delenv(BESIDE_OPT_IN_ENV)
    assert not warms_up_beside(data, True, True)  # the default: the warm-up after the data
    for phase in (data, in_turn):
        phase.result()
        assert phase.settled.is_set() == phase.beside  # in turn: nothing to wait for


def test_the_warm_up_beside_the_data_builds_the_same_trainer(tiny_target, tmp_path: Path,
                                                             beside, monkeypatch):
    cfg = dataclasses.replace(tiny(), out=str(tmp_path), **SMALL)
    serial = Trainer(cfg, target=tiny_target)
    features = Features(tiny_target)
    monkeypatch.setattr(tiny_target, "features", features)
    heard = Heard()
    early = Trainer(cfg, target=tiny_target, on_phase=heard)
    assert features.calls == 0  # random features: the data's thread had the target
    assert early.split == serial.split and early.held_out == serial.held_out
    assert [(kind, phase) for kind, phase, _ in heard.events] == [
        (kind, p) for p in ("drafter", "parallelize", "data", "warmup", "data")
        for kind in ("begin", "end")]
    assert "meanwhile" in heard.texts["warmup"]
    assert early.warm.warmed == set(early.state.loader.shapes())
    seconds = early.warm.seconds
    assert seconds > 0 and early.warmup() == seconds  # nothing left: no second warm-up
    assert len(heard.events) == 10
    a, b = serial.state.loader.next_batch(), early.state.loader.next_batch()
    assert torch.equal(a.input_ids_BS, b.input_ids_BS)
    assert all(p.grad is None for p in early.drafter.parameters())
    assert early.run(final_save=False).step == cfg.steps


def test_a_shape_the_data_brings_is_warmed_when_it_is_in(tiny_target, tmp_path, beside,
                                                         monkeypatch):
    monkeypatch.setattr(train, "synthetic_shapes", lambda cfg: [(2, 32)])
    cfg = dataclasses.replace(tiny(), out=str(tmp_path), **SMALL)
    features = Features(tiny_target)
    monkeypatch.setattr(tiny_target, "features", features)
    trainer = Trainer(cfg, target=tiny_target)
    assert trainer.warm.warmed == {(2, 32)} and features.calls == 0
    trainer.warmup()
    assert trainer.warm.warmed == {(2, 32), (2, 64)}
    assert features.calls == 1  # in turn, with the target's own features


def test_out_of_memory_beside_the_data_warms_up_after_it(tiny_target, tmp_path, beside,
                                                         monkeypatch):
    real = Trainer.forward_loss

    def short_of_memory(self, ids, mask, gen, feats=None, **kw):
        if feats is not None:
            raise torch.OutOfMemoryError("CUDA out of memory (as a test)")
        return real(self, ids, mask, gen, feats, **kw)

    monkeypatch.setattr(Trainer, "forward_loss", short_of_memory)
    cfg = dataclasses.replace(tiny(), out=str(tmp_path), **SMALL)
    heard = Heard()
    trainer = Trainer(cfg, target=tiny_target, on_phase=heard)
    assert not trainer.warm.warmed and trainer.warm.seconds == 0
    assert any("device memory" in w for w in trainer.warm.warnings)
    ended = [phase for kind, phase, _ in heard.events if kind == "end"]
    assert ended == ["drafter", "parallelize", "data", "data"]  # the failed one never ended
    trainer.warmup()
    assert trainer.warm.warmed == set(trainer.state.loader.shapes())


def test_the_warm_up_drops_its_gradients_even_when_a_step_fails(tiny_target, tmp_path):
    cfg = dataclasses.replace(tiny(), out=str(tmp_path), **SMALL)
    trainer = Trainer(cfg, target=tiny_target)
    calls = 0

    def fails_second(ids, mask, gen, feats):
        nonlocal calls
        calls += 1
        loss = trainer._warm_loss(ids, mask, gen, feats)
        if calls == 2:
            loss.backward()
            raise RuntimeError("the second shape's step")
        return loss

    with pytest.raises(RuntimeError, match="second"):
        trainer.warm.run([(2, 64), (2, 32)], fails_second, trainer.drafter.parameters)
    assert all(p.grad is None for p in trainer.drafter.parameters())
    assert not trainer.warm.warmed
