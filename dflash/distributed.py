"""Several processes, one device each, under torchrun: data parallel with the drafter
sharded by FSDP2 and the frozen target replicated.

torchrun sets RANK / WORLD_SIZE / LOCAL_RANK; without them this is a world of one and
nothing here touches torch.distributed. Each process compiles on its own main thread
(its own warm-up), so no thread ever compiles concurrently with another.

Data: every rank walks the same batch stream and takes every WORLD_SIZE-th batch, offset
by its rank (:class:`RankSlice`), so the stream position is one number whatever the world
size, and a checkpoint resumes at another world size.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
from torch import nn


@dataclass(frozen=True, slots=True)
class World:
    """The ranks that train the drafter together. Colocated, that is the whole launch;
    with split roles (:mod:`dflash.roles`) it is the drafter ranks' own process group."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0
    group: Any = None
    """The process group of these ranks (None: the default group, the whole launch)."""
    devices: int = 0
    """Devices in the whole launch, target ranks included (0: ``size``); MFU's denominator."""

    @property
    def device_count(self) -> int:
        return self.devices or self.size

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.size > 1


def detect(env: dict[str, str] | None = None) -> World:
    """The launcher's world, from RANK / WORLD_SIZE / LOCAL_RANK (torchrun's variables)."""
    env = dict(os.environ) if env is None else env
    try:
        size = int(env.get("WORLD_SIZE", "1"))
        rank = int(env.get("RANK", "0"))
        local = int(env.get("LOCAL_RANK", str(rank)))
    except ValueError as exc:
        raise ValueError(f"bad torchrun environment: {exc}") from None
    if size < 1 or not 0 <= rank < size:
        raise ValueError(f"bad torchrun environment: RANK={rank}, WORLD_SIZE={size}")
    return World(rank=rank, size=size, local_rank=local)


def init(world: World, device: torch.device, timeout_s: float = 300.0) -> None:
    """Join the process group: NCCL on GPUs (one per local rank), gloo on CPU."""
    if not world.distributed:
        return
    import torch.distributed as dist

    if dist.is_initialized():
        return
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo",
                            timeout=timedelta(seconds=timeout_s))


def shutdown(world: World) -> None:
    if world.distributed:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


def gather_gate(world: World, passed: bool, findings: list[str]) -> list[tuple[int, list[str]]]:
    """Every rank's gate result, on every rank: [(rank, findings)] for the ranks that
    failed. All ranks then stop together, so no rank waits in a collective forever."""
    if not world.distributed:
        return [] if passed else [(0, findings)]
    import torch.distributed as dist

    results: list[Any] = [None] * world.size
    dist.all_gather_object(results, (world.rank, passed, findings))
    return [(rank, f) for rank, ok, f in results if not ok]


def shard(drafter: nn.Module, compute_dtype: torch.dtype, world: World,
          device: torch.device) -> None:
    """FSDP2 over the world's ranks: each decoder layer and the root sharded; fp32
    parameters (the master weights), computed in ``compute_dtype``, gradients reduced in
    fp32."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = None
    if world.group is not None:
        from torch.distributed.device_mesh import DeviceMesh

        mesh = DeviceMesh.from_group(world.group, device.type)
    policy = MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32)
    for layer in drafter.layers:  # type: ignore[union-attr]
        fully_shard(layer, mesh=mesh, mp_policy=policy)
    fully_shard(drafter, mesh=mesh, mp_policy=policy)


def all_reduce_sum(world: World, values: torch.Tensor) -> torch.Tensor:
    """Sum a metrics vector over ranks (at log points only, never in the step)."""
    if world.distributed:
        import torch.distributed as dist

        values = values.clone()
        dist.all_reduce(values, group=world.group)
    return values


class RankSlice:
    """Rank r of W takes batches r, r+W, r+2W, ... of the shared stream."""

    def __init__(self, loader: Any, world: World) -> None:
        self.loader = loader
        self.world = world

    def next_batch(self) -> Any:
        mine = None
        for i in range(self.world.size):
            batch = self.loader.next_batch()
            if i == self.world.rank:
                mine = batch
        return mine

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = self.loader.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.loader.load_state_dict(state)

    def shapes(self) -> list[tuple[int, int]]:
        shapes: list[tuple[int, int]] = self.loader.shapes()
        return shapes
