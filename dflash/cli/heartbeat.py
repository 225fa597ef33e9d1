"""dflash-train's heartbeat: a plain line on stderr every ``--log-every-seconds`` (30 s by
default) and/or every ``--log-every-steps`` steps, when nobody watches a terminal (nohup,
a log file, CI). It hears the :class:`~dflash.ticks.Tick` of every step of the target's
pretraining and of the drafter's training, and says::

    dflash-train: training step 120/600 (20 %)  loss 2.3456  τ 1.85  held-out τ 2.10
        ctx 12,345 tok/s  ETA 3m12s

(one line). Tokens/s and the ETA are measured over the interval since the previous line
(the first line of a work, over the time since its first tick). On a terminal the live
display of :mod:`dflash.cli.display` shows the same, so no heartbeat is made there
(:func:`heartbeat_for`); under torchrun only rank 0 has one.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TextIO

from dflash.ticks import Tick, Values

PROG = "dflash-train"
DEFAULT_SECONDS = 30.0


def duration(seconds: float) -> str:
    """``45s``, ``3m12s``, ``2h05m``."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def beat_line(tick: Tick, values: Values, *, tokens_per_s: float | None,
              eta_s: float | None) -> str:
    """The heartbeat's line for ``tick`` (without the program name): what it knows."""
    parts = [f"{tick.work} step {tick.step}/{tick.total} "
             f"({100 * tick.step // max(1, tick.total)} %)"]
    loss = values.get("loss")
    if "loss" in values:
        parts.append("loss nan" if loss is None else f"loss {loss:.4f}")
    for key, label in (("tau", "τ"), ("held_out_tau", "held-out τ"),
                       ("held_out_decode_tau", "decode τ")):
        value = values.get(key)
        if value is not None:
            parts.append(f"{label} {value:.2f}")
    if tokens_per_s is not None:
        parts.append(f"{tokens_per_s:,.0f} tok/s")
    if eta_s is not None:
        parts.append(f"ETA {duration(eta_s)}")
    return "  ".join(parts)


@dataclass(slots=True)
class _Mark:
    """Where the previous line of one work was: its time, step and tokens since."""

    seconds: float
    step: int
    tokens: int = 0


class Heartbeat:
    """A :data:`~dflash.ticks.TickFn` that writes :func:`beat_line` when a line is due:
    ``every_seconds`` after the previous one of the same work (0: never by time), or at
    every multiple of ``every_steps`` (0: never by steps)."""

    def __init__(self, *, every_seconds: float = DEFAULT_SECONDS, every_steps: int = 0,
                 stream: TextIO | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.every_seconds = every_seconds
        self.every_steps = every_steps
        self.stream = stream if stream is not None else sys.stderr
        self.clock = clock
        self._marks: dict[str, _Mark] = {}

    def __call__(self, tick: Tick) -> None:
        now = self.clock()
        mark = self._marks.get(tick.work)
        if mark is None or tick.step < mark.step:  # a work begins (or begins again)
            self._marks[tick.work] = _Mark(now, tick.step)  # its tokens came before now
            if not self._due_by_steps(tick):
                return
            mark = self._marks[tick.work]
        else:
            mark.tokens += tick.tokens
        by_time = self.every_seconds > 0 and now - mark.seconds >= self.every_seconds
        if not (by_time or self._due_by_steps(tick)):
            return
        elapsed, steps = now - mark.seconds, tick.step - mark.step
        rate = mark.tokens / elapsed if elapsed > 0 and steps > 0 else None
        eta = (tick.total - tick.step) * elapsed / steps if steps > 0 else None
        line = beat_line(tick, tick.read(), tokens_per_s=rate, eta_s=eta)
        # One write per line (two ranks' lines never interleave into one).
        self.stream.write(f"{PROG}: {line}\n")
        self.stream.flush()
        self._marks[tick.work] = _Mark(now, tick.step)

    def _due_by_steps(self, tick: Tick) -> bool:
        return self.every_steps > 0 and tick.step > 0 and tick.step % self.every_steps == 0


def heartbeat_for(*, quiet: bool, every_seconds: float, every_steps: int,
                  stream: TextIO | None = None) -> Heartbeat | None:
    """The heartbeat of a run: None when ``quiet``, when both intervals are 0, or when
    ``stream`` (default stderr) is a terminal, where the live display shows progress."""
    stream = stream if stream is not None else sys.stderr
    if quiet or (every_seconds <= 0 and every_steps <= 0) or stream.isatty():
        return None
    return Heartbeat(every_seconds=every_seconds, every_steps=every_steps, stream=stream)
