"""Target-only greedy decoding with its step captured: the fair clock for a captured cycle.

``dflash-eval`` times a decoder against target-only greedy decoding, one target forward
a token. The eager reference (:func:`dflash.decoding.speculative.target_greedy`) pays its
operators' dispatch at every token; at batch 1 that is most of a small target's forward.
A captured speculative cycle (``--cycle static``) pays one graph launch a cycle, so its
speedup over the eager reference mixes two gains: fewer target forwards, and no dispatch.
On the twelfth real-target run that speedup read 11-16x, and "a cycle in target forwards"
read 0.3-0.8, less than the one verify forward every cycle runs.

:class:`CapturedGreedy` decodes target-only on a :class:`~dflash.decoding.static.StaticTarget`
that runs one token at a time, the step recorded once as a CUDA graph (on a CPU the same
code runs eagerly). The speedup over it is what speculation itself buys, and a cycle's
cost in its forwards is one captured forward or more. ``dflash-eval`` reports both
references on the static path, and checks that this one's tokens are the eager
reference's.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from dflash.decoding import static
from dflash.decoding.speculative import DecodeResult, finish, hit_stop
from dflash.meter import sync_device
from dflash.target import TargetModel


class CapturedGreedy:
    """Target-only greedy decoding, one captured forward a token, on a static cache sized
    for the longest prompt so far (made again, and recorded again, when one needs more)."""

    def __init__(self, target: TargetModel, graphs: bool) -> None:
        if not static.supports(target):
            raise ValueError("the captured reference runs dflash's own Qwen3 targets only")
        self.target = target
        self.graphs = graphs
        self.slots = 0
        self._static: static.StaticTarget | None = None

    def _sized(self, positions: int) -> static.StaticTarget:
        slots = static.slots_for(positions + 1, self.slots)
        if self._static is None or slots != self.slots:
            self._static = None  # free the old buffers before the new ones
            self.slots = slots
            self._static = static.StaticTarget(self.target, 1, slots, self.graphs)
        return self._static

    @torch.no_grad()
    def __call__(self, prompt: Sequence[int], *, max_new_tokens: int,
                 stop_ids: Sequence[int] = ()) -> DecodeResult:
        """Greedy tokens after ``prompt`` (as :func:`~dflash.decoding.speculative.
        target_greedy`), timed from the prefill (the cache is made and the step recorded
        before the clock starts)."""
        engine = self._sized(len(prompt) + max_new_tokens)
        device = self.target.device
        last_11 = torch.zeros(1, 1, dtype=torch.long, device=device)
        sync_device(device)
        t0 = time.perf_counter()
        first, _ = engine.prefill(prompt)
        tokens = [first]
        forwards = 0
        while len(tokens) < max_new_tokens and not hit_stop(tokens[-1:], stop_ids):
            last_11.fill_(tokens[-1])
            truth_1, _ = engine.verify(last_11, len(prompt) + len(tokens) - 1)
            tokens.append(int(truth_1[0]))
            forwards += 1
        sync_device(device)
        return DecodeResult(finish(tokens, max_new_tokens, stop_ids), forwards,
                            time.perf_counter() - t0)
