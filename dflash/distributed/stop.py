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
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dflash.distributed.world import World

if TYPE_CHECKING:
    import torch


class StopVote:
    """Call it at each step boundary with this rank's own wish to stop; it returns whether
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

    def __call__(self, wish: bool) -> bool:
        if not self.world.distributed:
            return wish
        if self._collect():
            return True
        import torch
        import torch.distributed as dist

        self._flag = torch.tensor([int(wish)], dtype=torch.int32)
        self._work = dist.all_reduce(self._flag, op=dist.ReduceOp.MAX, group=self._group,
                                     async_op=True)
        return False

    def _collect(self) -> bool:
        """The previous round's result (False when none is on its way)."""
        if self._work is None or self._flag is None:
            return False
        self._work.wait()
        self._work = None
        return bool(int(self._flag.item()))

    def close(self) -> None:
        """Finish the round on its way: every rank started as many as the others."""
        self._collect()
