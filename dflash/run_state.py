"""A Trainer's state on disk, in either mode: one process (a plain checkpoint of the fp32
master weights) or torchrun (DCP shards, :mod:`dflash.sharded_checkpoint`), and each
resumed in the other mode too."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from dflash import checkpoint as ckpt
from dflash.model import DFlashDrafter
from dflash.sharded_checkpoint import is_sharded, load_sharded, read_sharded_full, save_sharded

if TYPE_CHECKING:
    from dflash.train import Trainer


def trainer_state(t: Trainer) -> dict[str, Any]:
    rng: dict[str, Any] = {"torch": torch.get_rng_state(),
                           "anchor": t.anchor_gen.get_state()}
    if t.rt.device.type == "cuda":
        rng["cuda"] = torch.cuda.get_rng_state(t.rt.device)
    return {"step": t.step, "optimizer": t.opt.state_dict(), "rng": rng,
            "loader": t.loader_state, "config": t.cfg.to_dict()}


def save(t: Trainer) -> Path:
    if t.world.distributed:
        state = trainer_state(t)
        state.pop("optimizer")  # in the DCP shards
        state["rank_state"] = state.pop("rng")
        return save_sharded(t.out, t.step, t.drafter, t.opt.opt, state,
                            t.world, t.cfg.keep_checkpoints)
    return ckpt.save_training_checkpoint(t.out, t.step, t.dcfg,
                                         t.opt.master_state_dict(), trainer_state(t),
                                         keep=t.cfg.keep_checkpoints)


def resume(t: Trainer, folder: Path) -> None:
    if t.world.distributed:
        _resume_sharded(t, folder)
        return
    state = ckpt.read_trainer_state(folder)
    if is_sharded(state):
        _resume_from_sharded(t, folder, state)
        return
    drafter = ckpt.load_drafter(folder, device="cpu", dtype=torch.float32)
    if drafter.cfg != t.dcfg:
        raise ckpt.CheckpointError(f"{folder} holds a drafter of another shape; "
                                   "resume with the config it was trained with")
    t.opt.load_master(drafter.state_dict())
    t.opt.load_state_dict(state["optimizer"])
    torch.set_rng_state(state["rng"]["torch"])
    if "cuda" in state["rng"] and t.rt.device.type == "cuda":
        torch.cuda.set_rng_state(state["rng"]["cuda"], t.rt.device)
    _continue_at(t, state, state["rng"]["anchor"])


def _resume_from_sharded(t: Trainer, folder: Path, state: dict[str, Any]) -> None:
    """One process continuing a torchrun run: rank 0's anchor stream, full weights."""
    weights, optim = read_sharded_full(folder, t.opt.names)
    try:
        t.opt.load_master(weights)
        t.opt.load_state_dict(optim)
    except (KeyError, RuntimeError, ValueError) as exc:
        raise ckpt.CheckpointError(f"{folder} does not fit this drafter: "
                                   f"{str(exc).splitlines()[0]}") from None
    _continue_at(t, state, state["ranks"][0]["anchor"])


def _resume_sharded(t: Trainer, folder: Path) -> None:
    state = load_sharded(folder, t.drafter, t.opt.opt, t.world)
    ranks = state["ranks"]
    if t.world.rank < len(ranks):  # same rank existed: continue its anchor stream
        _continue_at(t, state, ranks[t.world.rank]["anchor"])
    else:  # a larger world: a fresh, distinct stream for the new rank
        _continue_at(t, state, None)
        t.anchor_gen.manual_seed(t.cfg.seed + t.world.rank + 7919 * t.step)


def _continue_at(t: Trainer, state: dict[str, Any], anchor_rng: torch.Tensor | None) -> None:
    """The step, this rank's anchor stream (None: leave it) and the data position."""
    t.step = int(state["step"])
    if anchor_rng is not None:
        t.anchor_gen.set_state(anchor_rng)
    t.loader.load_state_dict(state["loader"])
    t.loader_state = t.loader.state_dict()


def export_sharded(t: Trainer) -> Path | None:
    """Gather the full drafter (a collective: every rank calls it); rank 0 exports."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
    )

    full = get_model_state_dict(
        t.drafter, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if not t.world.is_main:
        return None
    plain = DFlashDrafter(t.dcfg)
    plain.load_state_dict(full)
    return ckpt.export_drafter(plain, t.out / "drafter", dtype=t.rt.dtype)
