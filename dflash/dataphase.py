"""The data phase of a start: where its examples come from, and running it beside the
drafter's placing.

:func:`data_source` says where a phase's examples come from, in the order
:func:`dflash.startup.training_examples` looks; :class:`DataPhase` runs the phase, in turn
or, where the target generates the data on a GPU, in a thread of its own that begins
before the drafter is placed (:func:`generates_beside`), its decode loop on a CUDA stream
of its own (:func:`stream_of_its_own`). The warm-up may then run beside it too
(:mod:`dflash.warmup`).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext, suppress
from pathlib import Path
from typing import Literal

import torch

from dflash.config import TrainConfig
from dflash.data import Example
from dflash.heldout import Split
from dflash.meter import sync_stream
from dflash.startup import (
    StartClock,
    generation_batch,
    split_held_out,
    training_examples,
)
from dflash.target import TargetModel
from envguard.probe.background import Task

DataSource = Literal["given", "file", "shapes", "kept", "generate"]
"""Where the data phase's examples come from: handed to the trainer, the recipe's data
file, random batches of every shape, data the target generated before, or generated now."""


def data_source(cfg: TrainConfig, *, given: bool, shapes_only: bool,
                remembered: Path | None) -> DataSource:
    """The :data:`DataSource` of a data phase, in the order
    :func:`dflash.startup.training_examples` looks (``remembered``: the file of
    :func:`dflash.startup.remembered_examples`)."""
    if given:
        return "given"
    if cfg.data:
        return "file"
    if shapes_only:
        return "shapes"
    if remembered is not None and remembered.is_file():
        return "kept"
    return "generate"


def data_text(cfg: TrainConfig, source: DataSource, remembered: Path | None = None) -> str:
    """What the data phase does, for the progress display."""
    return {"given": "splitting the examples given",
            "file": f"reading the data ({cfg.data})",
            "shapes": "making random batches of every shape (warm-up only)",
            "kept": f"reading the data the target generated before ({remembered})",
            "generate": (f"generating the data with the target ({cfg.synthetic_prompts} "
                         f"prompts x {cfg.synthetic_response_tokens} tokens)")}[source]


def stream_of_its_own(device: torch.device) -> AbstractContextManager[object]:
    """On a GPU, a CUDA stream for the calling thread's work: the main thread's work on the
    default stream does not queue behind it, nor wait for it when it synchronises its own
    (:func:`dflash.meter.sync_stream`). Memory the thread frees stays cached for this
    stream until ``torch.cuda.empty_cache``."""
    if device.type != "cuda":
        return nullcontext()
    return torch.cuda.stream(torch.cuda.Stream(device))  # type: ignore[no-untyped-call]


BESIDE_OPT_OUT_ENV = "DFLASH_NO_DATA_BESIDE"
"""Set (non-empty): the data phase runs after the drafter's placing, not beside it."""


def generates_beside(device: torch.device, generating: bool) -> bool:
    """Whether the data phase runs beside the drafter's placing: where it generates with
    the target on a GPU (its decode loop waits on the device; on a CPU it would take the
    cores the placing's imports use), unless :data:`BESIDE_OPT_OUT_ENV` is set."""
    return generating and device.type == "cuda" and not os.environ.get(BESIDE_OPT_OUT_ENV)


class DataPhase:
    """The data phase, begun before the drafter is placed where it generates on a GPU.

    On a new machine the placing is imports that wait on the disk (5 s at the 8B shape),
    and the target's decode loop for the synthetic data waits on the device (2.9 s): run
    side by side, the loop's seconds leave the path to the first step. The loop runs in a
    thread of its own (:class:`envguard.probe.background.Task`); nothing in it draws from
    a global random stream (greedy decoding of prompts from their own seed) and its batch
    is fixed before it starts, so the data and the key it is kept under
    (:func:`dflash.startup.remembered_path`) are those of the phase run in turn.
    :meth:`result` is then the ``data`` phase on the clock: the wait, with the loop's own
    seconds in ``data_beside``. Anywhere else (a data file, data generated before, a
    warm-up-only run, a CPU) :meth:`result` runs the phase itself, as before.

    Until :meth:`result`, the main thread must not run the target (its feature taps are
    the model's own), and until :attr:`settled` it must not draw random numbers on the
    device: the loop records its step in a CUDA graph, and the process's default CUDA
    generator refuses a draw during another thread's recording. The drafter's placing
    does neither; the warm-up beside the data (:mod:`dflash.warmup`) waits for
    :attr:`settled` and steps with random features. On a GPU the loop runs on a stream of
    its own (:func:`stream_of_its_own`)."""

    def __init__(self, clock: StartClock, cfg: TrainConfig, target: TargetModel, *,
                 examples: list[Example] | None, shapes_only: bool, ranks: int,
                 remembered: Path | None, batch: int | None = None,
                 beside: bool | None = None) -> None:
        self.clock = clock
        source = data_source(cfg, given=examples is not None, shapes_only=shapes_only,
                             remembered=remembered)
        self.text = data_text(cfg, source, remembered)
        generating = source == "generate"
        if generating and batch is None:
            batch = generation_batch(target, cfg)

        def make(on_settled: Callable[[], None] | None = None) -> Split:
            if examples is not None:
                return split_held_out(cfg, examples)
            return training_examples(cfg, target, shapes_only=shapes_only, ranks=ranks,
                                     remembered=remembered, batch=batch,
                                     on_settled=on_settled)

        self._make = make
        self._device = target.device
        self.settled = threading.Event()
        """Set once a phase run beside will allocate no more device memory and record
        nothing: its captured loop only replays (or it ended). From then on the main
        thread may compile and run the warm-up beside it (:meth:`dflash.train.Trainer.
        warmup`)."""
        if beside is None:
            beside = generates_beside(target.device, generating)
        self._task: Task[tuple[Split, float]] | None = None
        if beside:
            start = time.perf_counter()

            def timed() -> tuple[Split, float]:
                try:
                    with stream_of_its_own(target.device):
                        split = make(self.settled.set)
                        sync_stream(target.device)
                finally:
                    self.settled.set()
                return split, time.perf_counter() - start

            self._task = Task(timed)

    @property
    def beside(self) -> bool:
        return self._task is not None

    def meanwhile(self, text: str) -> str:
        """``text`` of the phase run beside this one, saying so."""
        return f"{text} (the target generates the data meanwhile)" if self.beside else text

    @contextmanager
    def alongside(self) -> Iterator[None]:
        """Around what runs beside the phase: where that raises, the phase is let end
        before the error goes on (a thread still driving the device while the interpreter
        exits can crash it); its own error is then dropped."""
        try:
            yield
        except BaseException:
            if self._task is not None:
                with suppress(BaseException):
                    self._task.result()
            raise

    def result(self) -> Split:
        """The training and held-out split: the ``data`` phase (or its end)."""
        if self._task is None:
            with self.clock.phase("data", self.text):
                return self._make()
        with self.clock.phase("data", f"{self.text}, begun beside the placing"):
            split, seconds = self._task.result()
            if self._device.type == "cuda":
                torch.cuda.empty_cache()  # what the loop's stream had cached, for any stream
        self.clock.seconds["data_beside"] = seconds
        return split
