"""The warm-up: every graph a training step can need, compiled before the first step.

One full step (forward and backward) per batch shape, on the main thread and with a random
stream of its own, so training is unaffected; then compilation is sealed
(:mod:`dflash.compilation.kernels`). With compilation on, a Mega-Cache artifact saved
under this environment's compile-compat key is loaded first, and one is saved after a
warm-up that had none (:mod:`dflash.compilation.megacache`). A step's values do not
matter here, only its shapes: gradients are dropped and nothing is stepped.

**Beside the data.** Where the target generates the synthetic data in a thread while the
drafter is placed (:class:`dflash.dataphase.DataPhase`), the warm-up need not wait for the
data: those batches' shapes are known before the data exists
(:func:`dflash.startup.synthetic_shapes`), and the warm-up's steps take random features
of the target's width instead of the target's own (the thread is running the target).
It starts once the thread has settled (its captured decode loop only replays: it
allocates no device memory and records nothing more), and compiles while the loop's last
steps run on the device. Should the two not fit in device memory together, the warm-up
runs again after the data (with a warning); a shape the data turns out to have that was
not warmed is warmed when the data is in, the seal lifted and set again.
It is off unless :data:`BESIDE_OPT_IN_ENV` is set: on two H100s it gained nothing the
launches' own spread did not swamp (to the first step, 19.14 s against 18.48 s in turn on
one stream; 18.18 and 16.07 s against 17.08 and 18.63 s with the loop on a stream of its
own, alternating; docs/BENCHMARKS.md, issue 36, eleventh and twelfth runs): the warm-up
grows by about what the data's wait shrinks.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Sequence

import torch
from torch import Tensor

from dflash.compilation.kernels import require_main_thread, seal, unseal
from dflash.compilation.megacache import WarmUpCache, before_warmup
from dflash.dataphase import DataPhase
from dflash.meter import sync_stream
from dflash.startup import StartClock

StepFn = Callable[[Tensor, Tensor, torch.Generator, Tensor | None], Tensor]
"""One step's loss: (input ids [B, S], loss mask [B, S], the anchors' generator, the
features [B, S, F] or None for the target's own)."""

BESIDE_OPT_IN_ENV = "DFLASH_WARMUP_BESIDE"
"""Set (non-empty): the warm-up runs while the data phase ends, where it can
(:func:`warms_up_beside`); unset, it waits for the data."""

Shape = tuple[int, int]


def warms_up_beside(data: DataPhase, compiled: bool, alone: bool) -> bool:
    """Whether the warm-up runs while ``data`` ends: a phase run beside the placing, a
    warm-up that compiles (an eager one has nothing to gain), one process (under torchrun
    a rank that ran out of memory and warmed up later would leave the others waiting in
    a collective; split roles ask a target rank for the features in a fixed order), and
    :data:`BESIDE_OPT_IN_ENV` set."""
    return data.beside and compiled and alone and bool(os.environ.get(BESIDE_OPT_IN_ENV))


class WarmUp:
    """The warm-up of one trainer: what it compiled, and what it took."""

    def __init__(self, *, clock: StartClock, device: torch.device, vocab_size: int,
                 seed: int, compiled: bool, mega_cache: str) -> None:
        self.clock, self.device, self.vocab_size = clock, device, vocab_size
        self.seed, self.compiled, self.mega_cache = seed, compiled, mega_cache
        self.seconds = 0.0
        self.phases = dict.fromkeys(("forward", "backward"), 0.0)
        """Seconds per part of the steps (compiles land in the first call of each)."""
        self.mega_loaded: float | None = None
        self.mega_saved = 0
        self.warnings: list[str] = []
        self.warmed: set[Shape] = set()
        self._mega: WarmUpCache | None = None
        self._mega_tried = False

    def pending(self, shapes: Sequence[Shape]) -> list[Shape]:
        return [s for s in shapes if s not in self.warmed]

    def run(self, shapes: Sequence[Shape], loss_of: StepFn, params: Callable[[], Iterable[Tensor]],
            *, features: tuple[int, torch.dtype] | None = None, text: str = "") -> float:
        """Warm up every shape of ``shapes`` not warmed yet (nothing to do: no phase);
        ``features``: (width, dtype) of random features to step with, else the target's.
        Returns the warm-up's seconds so far."""
        require_main_thread("warm-up")
        todo = self.pending(shapes)
        if not todo:
            return self.seconds
        what = "compiling (warm-up)" if self.compiled else "warm-up (eager)"
        with self.clock.phase("warmup", what + text):
            start = time.perf_counter()
            if self.warmed and self.compiled:
                unseal()  # a shape the data brought that the first warm-up did not know
            if self.compiled and not self._mega_tried:  # once, even if this run fails
                self._mega_tried = True
                self._mega = before_warmup(self.mega_cache)
                if self._mega is not None:
                    self.mega_loaded = self._mega.loaded_seconds
                    if self._mega.problem is not None:
                        self.warnings.append(self._mega.problem)
            try:
                self._steps(todo, loss_of, features)
            finally:
                for p in params():
                    p.grad = None
            sync_stream(self.device)
            if self.compiled:
                seal()
            if self._mega is not None:
                self.mega_saved, self._mega = self._mega.after_warmup(), None
            self.warmed.update(todo)
            self.seconds += time.perf_counter() - start
        return self.seconds

    def _steps(self, shapes: list[Shape], loss_of: StepFn,
               features: tuple[int, torch.dtype] | None) -> None:
        gen = torch.Generator(device=self.device).manual_seed(self.seed + 1)

        def lap(phase: str, t0: float) -> float:
            sync_stream(self.device)
            now = time.perf_counter()
            self.phases[phase] += now - t0
            return now

        for bsz, seq in shapes:
            ids_BS = torch.randint(0, self.vocab_size, (bsz, seq), device=self.device,
                                   generator=gen)
            mask_BS = torch.ones_like(ids_BS)
            feats_BSF = None
            if features is not None:
                width, dtype = features
                feats_BSF = torch.randn(bsz, seq, width, device=self.device, dtype=dtype,
                                        generator=gen)
            t0 = time.perf_counter()
            loss = loss_of(ids_BS, mask_BS, gen, feats_BSF)
            t0 = lap("forward", t0)
            loss.backward()  # type: ignore[no-untyped-call]
            lap("backward", t0)

    def beside(self, data: DataPhase, shapes: Sequence[Shape], loss_of: StepFn,
               params: Callable[[], Iterable[Tensor]], features: tuple[int, torch.dtype]
               ) -> None:
        """The warm-up while ``data`` (run beside) ends, once it has settled. Where the
        device runs out of memory with both, it is left to after the data (nothing is
        marked warmed), and a warning says so."""
        with self.clock.phase("data", f"{data.text}: waiting until its decode loop only "
                                      "replays"):
            data.settled.wait()
        try:
            self.run(shapes, loss_of, params, features=features,
                     text=", the target generating the data meanwhile")
        except torch.OutOfMemoryError:
            self.warnings.append("the warm-up and the data's generation did not fit in "
                                 "device memory together: warmed up after the data")
