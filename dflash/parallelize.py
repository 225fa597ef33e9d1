"""Where and how the drafter runs: the config's ``auto`` settings resolved for this machine
(:func:`resolve`), and :func:`parallelize`, which applies them in the one order that works.

As torchtitan's ``parallelize()``: the model is built plain (:mod:`dflash.model` has no
parallelism in it), then one function places it, shards it with FSDP2 under torchrun, and
only then makes the compiled attention kernels, on the main thread, before any helper
thread exists (:mod:`dflash.compilation.kernels`). The kernels compile lazily, in the
trainer's warm-up, on the already-sharded model.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dflash.compilation.kernels import Kernels, kernels, start_compile_workers
from dflash.compilation.megacache import compile_will_run
from dflash.config import TrainConfig, kernels_for
from dflash.distributed.world import World
from dflash.model import DFlashDrafter


@dataclass(frozen=True, slots=True)
class Runtime:
    """The auto settings of a TrainConfig, resolved for this machine."""

    device: torch.device
    dtype: torch.dtype
    attention: str
    compile: bool


def resolve(cfg: TrainConfig) -> Runtime:
    if cfg.device == "auto":
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    else:
        device = torch.device(cfg.device)
    gpu = device.type == "cuda"
    dtype = {"auto": torch.bfloat16 if gpu else torch.float32,
             "bfloat16": torch.bfloat16, "float32": torch.float32}[cfg.dtype]
    attention, compile_on = kernels_for(cfg, gpu=gpu)
    return Runtime(device=device, dtype=dtype, attention=attention, compile=compile_on)


def parallelize(drafter: DFlashDrafter, rt: Runtime, world: World,
                mega_cache: str = "off") -> Kernels:
    """Place ``drafter`` on ``rt.device``; under torchrun shard it with FSDP2 first; then
    make the attention kernels (compiled when ``rt.compile``), and where the warm-up will
    compile for real (``mega_cache``: the recipe's setting), start the compile workers.

    One process: the parameters are cast to ``rt.dtype`` (the optimizer keeps fp32
    masters). torchrun: the fp32 shards are the master weights, each decoder layer and
    the root are sharded over the world's ranks, computed in ``rt.dtype`` with
    gradients reduced in fp32."""
    if world.distributed:
        drafter.to(rt.device)
        _fully_shard(drafter, rt, world)
    else:
        drafter.to(rt.device, rt.dtype)
    made = kernels(rt.compile)
    if made.compiled and compile_will_run(mega_cache):
        start_compile_workers()
    return made


def _fully_shard(drafter: DFlashDrafter, rt: Runtime, world: World) -> None:
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = None
    if world.group is not None:
        from torch.distributed.device_mesh import DeviceMesh

        mesh = DeviceMesh.from_group(world.group, rt.device.type)
    policy = MixedPrecisionPolicy(param_dtype=rt.dtype, reduce_dtype=torch.float32)
    for layer in drafter.layers:
        fully_shard(layer, mesh=mesh, mp_policy=policy)
    fully_shard(drafter, mesh=mesh, mp_policy=policy)
