"""A run's checkpoints in either mode, and each resumed in the other mode too: one process
writes a plain checkpoint of the fp32 master weights (:mod:`.local`), torchrun writes DCP
shards (:mod:`.sharded`). The training loop hands its state in and gets a
:class:`Resumed` back; it never needs to know which kind a folder holds.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from dflash.checkpoint.export import export_drafter, load_drafter
from dflash.checkpoint.layout import EXPORT_NAME
from dflash.checkpoint.local import read_trainer_state, save_training_checkpoint
from dflash.checkpoint.sharded import is_sharded, load_sharded, read_sharded_full, save_sharded
from dflash.distributed.world import World
from dflash.errors import CheckpointError
from dflash.model import DFlashDrafter
from dflash.optim import MasterAdamW


@dataclass(frozen=True, slots=True)
class Resumed:
    """Where a resumed run continues."""

    step: int
    loader: dict[str, Any]
    """The data position after the last batch the optimizer consumed."""
    anchor_rng: torch.Tensor | None
    """This rank's anchor-RNG state; None for a rank the checkpoint did not have (a run
    resumed at a larger world size), which then starts a fresh stream."""


def save(out: Path, state: dict[str, Any], drafter: DFlashDrafter, optimizer: MasterAdamW,
         world: World, keep: int) -> Path:
    """Checkpoint ``state`` (trainer.pt's content: step, optimizer, rng, loader, config)
    with the weights; under torchrun a collective, every rank calls it."""
    if world.distributed:
        state = dict(state)
        state.pop("optimizer")  # in the DCP shards
        state["rank_state"] = state.pop("rng")
        return save_sharded(out, int(state["step"]), drafter, optimizer.adamw, state, world,
                            keep)
    return save_training_checkpoint(out, int(state["step"]), drafter.cfg,
                                    optimizer.master_state_dict(), state, keep=keep)


def resume(folder: Path, drafter: DFlashDrafter, optimizer: MasterAdamW, world: World,
           device: torch.device) -> Resumed:
    """Load ``folder`` (either kind) into ``drafter`` and ``optimizer``; one process also
    gets the global RNG states back. Under torchrun a collective."""
    if world.distributed:
        return _resume_sharded(folder, drafter, optimizer, world)
    state = read_trainer_state(folder)
    if is_sharded(state):
        return _resume_from_sharded(folder, optimizer, state)
    loaded = load_drafter(folder, device="cpu", dtype=torch.float32)
    if loaded.cfg != drafter.cfg:
        raise CheckpointError(f"{folder} holds a drafter of another shape; "
                              "resume with the config it was trained with")
    optimizer.load_master(loaded.state_dict())
    optimizer.load_state_dict(state["optimizer"])
    torch.set_rng_state(state["rng"]["torch"])
    if "cuda" in state["rng"] and device.type == "cuda":
        torch.cuda.set_rng_state(state["rng"]["cuda"], device)
    return Resumed(int(state["step"]), state["loader"], state["rng"]["anchor"])


def _resume_from_sharded(folder: Path, optimizer: MasterAdamW, state: dict[str, Any]
                         ) -> Resumed:
    """One process continuing a torchrun run: rank 0's anchor stream, full weights."""
    weights, optim = read_sharded_full(folder, optimizer.names)
    try:
        optimizer.load_master(weights)
        optimizer.load_state_dict(optim)
    except (KeyError, RuntimeError, ValueError) as exc:
        raise CheckpointError(f"{folder} does not fit this drafter: "
                              f"{str(exc).splitlines()[0]}") from None
    return Resumed(int(state["step"]), state["loader"], state["ranks"][0]["anchor"])


def _resume_sharded(folder: Path, drafter: DFlashDrafter, optimizer: MasterAdamW,
                    world: World) -> Resumed:
    state = load_sharded(folder, drafter, optimizer.adamw, world)
    ranks = state["ranks"]
    anchor = ranks[world.rank]["anchor"] if world.rank < len(ranks) else None
    return Resumed(int(state["step"]), state["loader"], anchor)


def export(out: Path, drafter: DFlashDrafter, world: World, dtype: torch.dtype,
           extra: dict[str, Any] | None = None) -> Path | None:
    """Export the drafter to OUT/drafter (``extra``: more config.json fields). Under
    torchrun a collective: every rank gathers the full drafter, rank 0 exports it (the
    others return None)."""
    if not world.distributed:
        return export_drafter(drafter, out / EXPORT_NAME, dtype=dtype, extra=extra)
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
    )

    full = get_model_state_dict(
        drafter, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if not world.is_main:
        return None
    plain = DFlashDrafter(drafter.cfg)
    plain.load_state_dict(full)
    return export_drafter(plain, out / EXPORT_NAME, dtype=dtype, extra=extra)
