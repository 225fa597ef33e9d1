"""What long work tells whoever shows progress, one optimizer step at a time: the target's
pretraining (the ``tiny-stdlib`` target, built on first use, a start phase that runs for
minutes) and the drafter's training.

A :class:`Tick` is plain data plus one reader: reading the latest values (loss, tau) may
wait for the device, so the work hands over a function and the listener calls it only
when it shows a line (``dflash-train`` every 30 s by default, :mod:`dflash.cli.heartbeat`).
Nothing here prints and nothing imports torch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

Values = dict[str, float | None]
"""``loss``, ``tau`` (the in-batch teacher-forced acceptance length), ``held_out_tau`` and
``held_out_decode_tau`` when the work has them at that point; None: not measured."""


def _none() -> Values:
    return {}


@dataclass(frozen=True, kw_only=True, slots=True)
class Tick:
    """``step`` of ``total`` steps of ``work`` done."""

    work: str
    """What runs: ``training`` or ``pretraining the target (tiny-stdlib)``."""
    step: int
    total: int
    tokens: int
    """Tokens this step processed, over every rank (0 for the tick sent before the first
    step, which only says when the work began)."""
    read: Callable[[], Values] = field(default=_none)
    """The latest values; may wait for the device, so called only to show them."""


TickFn = Callable[[Tick], None]
