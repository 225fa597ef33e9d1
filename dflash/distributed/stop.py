"""Stopping together: whether to stop early, decided by every training rank alike.

torchrun forwards SIGTERM to each rank a moment apart, so one rank can see it at the end of
step N while another is already inside step N + 1. A rank that breaks out of the loop alone
leaves the others waiting in a collective (the next step's FSDP all-gather, or the
checkpoint's plan exchange) until torchrun kills them all 30 s later, with no checkpoint.

:class:`StopVote` makes the decision collective without a device sync: at every step
boundary each rank starts an all-reduce (MAX) of its own flag on a small gloo group (host
memory, so no GPU stream is waited on) and reads the result of the one it started at the
previous boundary. Every rank then stops at the same step, one step after the first rank
saw the signal.

A rank's wish is a :class:`Stop`, not a flag: the run's time budget (``max_seconds``) ends a
run as its last step does, a signal ends it early. Each rank reads its own clock, so the
ranks can see the budget run out a step apart; the vote settles that as it settles a signal,
and the larger reason wins (a signal over the budget).
"""

from __future__ import annotations

from enum import IntEnum
from typing import TYPE_CHECKING, Any

from dflash.distributed.world import World

if TYPE_CHECKING:
    import torch


class Stop(IntEnum):
    """Why a run leaves its loop before ``steps``; ordered, the vote keeps the largest."""

    NONE = 0
    TIME = 1
    """``max_seconds`` ran out: the run finishes as at its last step (evaluated, exported)."""
    SIGNAL = 2
    """SIGTERM (or ``stop_after``): a checkpoint, no export; ``--resume`` continues it."""


class StopVote:
    """Call it at each step boundary with this rank's own wish; it returns whether (and why)
    every rank stops now. A world of one answers its own wish at once."""

    def __init__(self, world: World) -> None:
        self.world = world
        self._group: Any = None
        self._flag: torch.Tensor | None = None
        self._work: Any = None
        if world.distributed:
            import torch.distributed as dist

            # Only the training ranks take part (a target rank never reaches the loop).
            self._group = dist.new_group(list(range(world.size)), backend="gloo",
                                         use_local_synchronization=True)

    def __call__(self, wish: Stop) -> Stop:
        if not self.world.distributed:
            return wish
        if (decided := self._collect()) is not Stop.NONE:
            return decided
        import torch
        import torch.distributed as dist

        self._flag = torch.tensor([int(wish)], dtype=torch.int32)
        self._work = dist.all_reduce(self._flag, op=dist.ReduceOp.MAX, group=self._group,
                                     async_op=True)
        return Stop.NONE

    def _collect(self) -> Stop:
        """The previous round's result (``NONE`` when none is on its way)."""
        if self._work is None or self._flag is None:
            return Stop.NONE
        self._work.wait()
        self._work = None
        return Stop(int(self._flag.item()))

    def close(self) -> None:
        """Finish the round on its way: every rank started as many as the others."""
        self._collect()
