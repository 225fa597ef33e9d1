"""The ranks of a launch: several processes, one device each, under torchrun.

torchrun sets RANK / WORLD_SIZE / LOCAL_RANK; without them this is a world of one and
nothing here touches torch.distributed. Colocated, every rank trains the drafter (FSDP2,
:mod:`dflash.parallelize`) with the frozen target replicated; with split roles
(:class:`Roles`, :mod:`dflash.distributed.roles`) the last K ranks run the target.
Each process compiles on its own main thread (its own warm-up), so no thread ever
compiles concurrently with another.

Importing this module imports no torch: the commands read the world and check the
roles before they load anything; torch.distributed is imported by the calls that need it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from dflash.errors import ConfigError, RunError

if TYPE_CHECKING:
    import torch
    from torch.distributed import ProcessGroup


@dataclass(frozen=True, slots=True)
class World:
    """The ranks that train the drafter together. Colocated, that is the whole launch;
    with split roles it is the drafter ranks' own process group."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0
    group: ProcessGroup | None = None
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


@dataclass(frozen=True, slots=True)
class Roles:
    """Which global rank does what with ``--target-ranks K``. Drafter ranks come first, so
    rank 0 (which logs and writes checkpoints) always trains."""

    world_size: int
    target_ranks: int

    def __post_init__(self) -> None:
        if not 0 < self.target_ranks < self.world_size:
            raise ConfigError(f"--target-ranks must be between 1 and WORLD_SIZE - 1 = "
                              f"{self.world_size - 1}, got {self.target_ranks}")

    @property
    def drafter_ranks(self) -> int:
        return self.world_size - self.target_ranks

    def is_target(self, rank: int) -> bool:
        return rank >= self.drafter_ranks

    def server_of(self, drafter_rank: int) -> int:
        return self.drafter_ranks + drafter_rank % self.target_ranks

    def clients_of(self, target_rank: int) -> list[int]:
        return [d for d in range(self.drafter_ranks) if self.server_of(d) == target_rank]


def detect(env: dict[str, str] | None = None) -> World:
    """The launcher's world, from RANK / WORLD_SIZE / LOCAL_RANK (torchrun's variables)."""
    env = dict(os.environ) if env is None else env
    try:
        size = int(env.get("WORLD_SIZE", "1"))
        rank = int(env.get("RANK", "0"))
        local = int(env.get("LOCAL_RANK", str(rank)))
    except ValueError as exc:
        raise ConfigError(f"bad torchrun environment: {exc}") from None
    if size < 1 or not 0 <= rank < size:
        raise ConfigError(f"bad torchrun environment: RANK={rank}, WORLD_SIZE={size}")
    return World(rank=rank, size=size, local_rank=local)


def init(world: World, device: torch.device, timeout_s: float = 300.0) -> None:
    """Join the process group: NCCL on GPUs (one per local rank), gloo on CPU."""
    if not world.distributed:
        return
    import torch
    import torch.distributed as dist

    if dist.is_initialized():
        return
    try:
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo",
                                timeout=timedelta(seconds=timeout_s))
    except (RuntimeError, ValueError) as exc:
        raise RunError(f"rank {world.rank}: cannot join the process group: "
                       f"{str(exc).splitlines()[0]}") from None


def barrier(world: World) -> None:
    """Wait until every rank of the launch gets here."""
    if world.distributed:
        import torch.distributed as dist

        dist.barrier()


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


def all_reduce_sum(world: World, values: torch.Tensor) -> torch.Tensor:
    """Sum a metrics vector over ranks (at log points only, never in the step)."""
    if world.distributed:
        import torch.distributed as dist

        values = values.clone()
        dist.all_reduce(values, group=world.group)
    return values
