"""Checkpoints under torchrun: torch.distributed.checkpoint (DCP) for the FSDP2-sharded
drafter and its optimizer, so a run resumes at another world size (DCP reshards on load).

Layout, as for one process: ``OUT/checkpoints/step-XXXXXXXX/`` plus ``latest``. The
folder holds DCP's shard files and ``trainer.pt`` (step, data position, config, every
rank's anchor-RNG state). Every rank writes its shards into ``.step-XXXXXXXX.partial``;
rank 0 writes trainer.pt, renames the folder into place and updates ``latest`` only
after all ranks finished. The output folder must be shared by all ranks.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import torch
from torch import nn

from dflash.checkpoint import LATEST_NAME, TRAINER_STATE_NAME, CheckpointError
from dflash.distributed import World
from envguard.atomic import write_text_atomic


def save_sharded(out: Path, step: int, model: nn.Module, optimizer: torch.optim.Optimizer,
                 state: dict[str, Any], world: World, keep: int) -> Path:
    """Collective: every rank calls it. Returns the checkpoint folder."""
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

    root = out / "checkpoints"
    final = root / f"step-{step:08d}"
    partial = root / f".{final.name}.partial"
    if world.is_main:
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
    dist.barrier(group=world.group)
    model_sd, optim_sd = get_state_dict(model, optimizer)
    dcp_save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(partial),
             process_group=world.group)
    ranks: list[Any] = [None] * world.size
    dist.all_gather_object(ranks, state.pop("rank_state"), group=world.group)
    if world.is_main:
        torch.save({**state, "ranks": ranks, "format": "dcp"}, partial / TRAINER_STATE_NAME)
        if final.exists():
            shutil.rmtree(final)
        partial.rename(final)
        write_text_atomic(root / LATEST_NAME, final.name + "\n")
        steps = sorted(p for p in root.glob("step-*") if p.is_dir())
        for old in steps[:-keep] if keep > 0 else []:
            if old != final:
                shutil.rmtree(old, ignore_errors=True)
    dist.barrier(group=world.group)
    return final


def load_sharded(folder: Path, model: nn.Module, optimizer: torch.optim.Optimizer,
                 world: World) -> dict[str, Any]:
    """Collective: fill the sharded model and optimizer from ``folder`` (any world size
    wrote it); returns trainer.pt's state."""
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    from torch.distributed.checkpoint.state_dict_loader import load as dcp_load

    try:
        state = torch.load(folder / TRAINER_STATE_NAME, map_location="cpu", weights_only=True)
    except (OSError, RuntimeError, EOFError, ValueError) as exc:
        raise CheckpointError(f"cannot read {folder / TRAINER_STATE_NAME}: {exc}") from None
    if not isinstance(state, dict) or state.get("format") != "dcp":
        raise CheckpointError(f"{folder} was written by a single-process run; resume it "
                              "without torchrun")
    model_sd, optim_sd = get_state_dict(model, optimizer)
    target: dict[str, Any] = {"model": model_sd, "optim": optim_sd}
    dcp_load(target, checkpoint_id=str(folder), process_group=world.group)
    set_state_dict(model, optimizer, model_state_dict=target["model"],
                   optim_state_dict=target["optim"])
    return state
