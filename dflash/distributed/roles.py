"""Split roles under torchrun, as in the incident (5 GPUs ran the target, 3 trained
drafters): ``--target-ranks K`` puts the frozen target on the last K ranks; the first
D = WORLD_SIZE - K ranks train the drafter (FSDP2 over their own process group) and get
their hidden-state features from the target ranks by point-to-point messages.

Protocol, per drafter rank d and its server t = D + d % K, in order on one channel:

    d -> t   header int64 [op, B, S]      op 1: features wanted, op 0: this client is done
    d -> t   input_ids int64 [B, S]       (op 1 only)
    t -> d   features [B, S, k*H]         in the target's dtype

A server answers its clients round-robin, one request each per turn. Every drafter rank
makes the same requests in the same order (warm-up, steps, evaluations), so the turns
line up. A drafter asks for the next batch's features before it trains on the current
one (:meth:`FeatureClient.request` returns a future; :class:`Lookahead` keeps the
trainer one batch ahead), so the target's forward runs while the drafter computes: that
overlap is the only way split roles can beat colocated ones.

If any process dies, torchrun stops the others; the process group's timeout bounds a
wait otherwise.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import Tensor

from dflash.distributed.world import Roles, World

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

OP_DONE, OP_FEATURES = 0, 1

Batch = tuple[Tensor, Tensor, dict[str, Any]]
"""A training batch as the prefetcher gives it: input ids [B, S], loss mask [B, S], and
the loader's state after it."""


def split(world: World, target_ranks: int) -> tuple[Roles, World]:
    """Collective (every rank calls it): make the drafter ranks' process group; return
    the roles and this rank's world within its role."""
    import torch.distributed as dist

    roles = Roles(world.size, target_ranks)
    drafters = list(range(roles.drafter_ranks))
    group = dist.new_group(drafters)  # every rank must take part in new_group
    if roles.is_target(world.rank):  # not a member: new_group gave it NON_GROUP_MEMBER
        return roles, World(rank=world.rank - roles.drafter_ranks, size=target_ranks,
                            local_rank=world.local_rank, devices=world.size)
    # A member's group is a ProcessGroup. torch 2.15 types new_group's result as
    # ``ProcessGroup | Literal[-100]`` (-100 for a non-member), older torch leaves it untyped.
    return roles, World(rank=world.rank, size=roles.drafter_ranks,
                        local_rank=world.local_rank, group=cast("ProcessGroup", group),
                        devices=world.size)


class FeatureClient:
    """A drafter rank's line to its target rank. ``request`` returns a future, so the
    next batch's features can be on their way while this one trains."""

    def __init__(self, server: int, feature_dim: int, dtype: torch.dtype,
                 device: torch.device) -> None:
        self.server = server
        self.feature_dim = feature_dim
        self.dtype = dtype
        self.device = device
        self.pending: deque[_Pending] = deque()
        self.closed = False

    def request(self, input_ids_BS: Tensor) -> Callable[[], Tensor]:
        import torch.distributed as dist

        bsz, seq = input_ids_BS.shape
        header = torch.tensor([OP_FEATURES, bsz, seq], dtype=torch.int64, device=self.device)
        ids = input_ids_BS.to(self.device, torch.int64).contiguous()
        out = torch.empty(bsz, seq, self.feature_dim, dtype=self.dtype, device=self.device)
        sends = [dist.isend(header, self.server), dist.isend(ids, self.server)]
        pending = _Pending(self, out, dist.irecv(out, self.server), sends, (header, ids))
        self.pending.append(pending)
        return pending.wait

    def features(self, input_ids_BS: Tensor) -> Tensor:
        return self.request(input_ids_BS)()

    def close(self) -> None:
        """Collect every answer still on its way, then tell the server this client is done."""
        import torch.distributed as dist

        if self.closed:
            return
        while self.pending:
            self.pending[0].wait()
        dist.send(torch.tensor([OP_DONE, 0, 0], dtype=torch.int64, device=self.device),
                  self.server)
        self.closed = True


class Lookahead:
    """A drafter rank's training batches with their features, one batch ahead: when the
    loop takes a batch, the features of the batch after it are already asked for, so the
    target rank computes them while this rank trains."""

    def __init__(self, client: FeatureClient) -> None:
        self.client = client
        self._ahead: tuple[Batch, Callable[[], Tensor]] | None = None

    def _ask(self, batch: Batch) -> tuple[Batch, Callable[[], Tensor]]:
        return batch, self.client.request(batch[0])

    def next(self, take: Callable[[], Batch], *, more: bool) -> tuple[Batch, Tensor]:
        """The next batch (from ``take`` unless asked for ahead) and its features; with
        ``more`` (another step follows), ask for the batch after it before waiting."""
        if self._ahead is None:
            self._ahead = self._ask(take())
        (batch, answer), self._ahead = self._ahead, None
        if more:
            self._ahead = self._ask(take())
        return batch, answer()

    def drain(self) -> None:
        """Take an answer asked for ahead that no step used (the loop stopped early): the
        target rank sends it anyway, and the stream must stay in step."""
        if self._ahead is not None:
            self._ahead[1]()
            self._ahead = None


class _Pending:
    def __init__(self, client: FeatureClient, out: Tensor, recv: Any, sends: list[Any],
                 keep: tuple[Tensor, ...]) -> None:
        self.client, self.out, self.recv, self.sends, self.keep = client, out, recv, sends, keep
        self.done = False

    def wait(self) -> Tensor:
        if not self.done:
            if self.client.pending[0] is not self:  # answers arrive in request order
                self.client.pending[0].wait()
            self.recv.wait()
            for work in self.sends:
                work.wait()
            self.done = True
            self.client.pending.popleft()
        return self.out


def serve(roles: Roles, rank: int, features: Callable[[Tensor], Tensor],
          device: torch.device) -> int:
    """A target rank's loop: answer its clients round-robin until each said done.
    Returns the number of requests answered."""
    import torch.distributed as dist

    active = roles.clients_of(rank)
    header = torch.empty(3, dtype=torch.int64, device=device)
    answered = 0
    while active:
        for client in list(active):
            dist.recv(header, client)
            op, bsz, seq = (int(v) for v in header.tolist())
            if op == OP_DONE:
                active.remove(client)
                continue
            if op != OP_FEATURES or bsz < 1 or seq < 1:
                raise RuntimeError(f"rank {rank}: bad feature request {[op, bsz, seq]} "
                                   f"from rank {client}")
            ids = torch.empty(bsz, seq, dtype=torch.int64, device=device)
            dist.recv(ids, client)
            dist.send(features(ids).contiguous(), client)
            answered += 1
    return answered
