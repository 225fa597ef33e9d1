"""Checkpoints under torchrun: torch.distributed.checkpoint (DCP) for the FSDP2-sharded
drafter and its optimizer, so a run resumes at another world size (DCP reshards on load).

Layout, as for one process: ``OUT/checkpoints/step-XXXXXXXX/`` plus ``latest``. The
folder holds DCP's shard files and ``trainer.pt`` (step, data position, config, every
rank's anchor-RNG state). Every rank writes its shards into ``.step-XXXXXXXX.partial``;
rank 0 writes trainer.pt, renames the folder into place and updates ``latest`` only
after all ranks finished. The output folder must be shared by all ranks.

Either kind of checkpoint resumes in the other mode: a single-process checkpoint under
torchrun (:func:`load_single_into_sharded`: full tensors, sharded on load), a DCP one
without torchrun (:func:`read_sharded_full`: DCP's own conversion to full tensors).
Before DCP reads a checkpoint, :func:`~dflash.checkpoint.dcp_check.check_dcp` makes sure
the files it will unpickle hold data only. Optimizer states are converted between torch's
two keyings: parameter index (one
process) and parameter name (``get_state_dict`` under FSDP2; the names are the same).
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from torch import nn

from dflash.checkpoint.dcp_check import check_dcp
from dflash.checkpoint.export import load_drafter
from dflash.checkpoint.layout import LATEST_NAME, TRAINER_STATE_NAME, prune, step_folder
from dflash.checkpoint.local import read_trainer_state
from dflash.distributed.world import World
from dflash.errors import CheckpointError
from envguard.atomic import write_text_atomic


def save_sharded(out: Path, step: int, model: nn.Module, optimizer: torch.optim.Optimizer,
                 state: dict[str, Any], world: World, keep: int) -> Path:
    """Collective: every rank calls it. Returns the checkpoint folder."""
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

    final = step_folder(out, step)
    root = final.parent
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
        prune(root, keep, final)
    dist.barrier(group=world.group)
    return final


def is_sharded(state: dict[str, Any]) -> bool:
    return state.get("format") == "dcp"


def optimizer_by_name(optim: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """A one-process optimizer state (keyed by parameter index) keyed by name instead."""
    return {"state": {names[int(i)]: v for i, v in optim["state"].items()},
            "param_groups": [{**g, "params": [names[int(i)] for i in g["params"]]}
                             for g in optim["param_groups"]]}


def optimizer_by_index(optim: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """The inverse of :func:`optimizer_by_name`."""
    index = {name: i for i, name in enumerate(names)}
    try:
        return {"state": {index[n]: v for n, v in optim["state"].items()},
                "param_groups": [{**g, "params": [index[n] for n in g["params"]]}
                                 for g in optim["param_groups"]]}
    except KeyError as exc:
        raise CheckpointError(f"the checkpoint's optimizer has a parameter {exc} this "
                              "drafter does not; resume with the config it was trained "
                              "with") from None


def load_single_into_sharded(folder: Path, state: dict[str, Any], model: nn.Module,
                             optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """Collective: a single-process checkpoint (``state`` is its trainer.pt) resumed
    under torchrun. Every rank reads the full weights and optimizer state;
    ``set_state_dict`` keeps its shard."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

    drafter = load_drafter(folder, device="cpu", dtype=torch.float32)
    state = dict(state)
    names = [n for n, p in drafter.named_parameters() if p.requires_grad]
    try:
        set_state_dict(model, optimizer, model_state_dict=drafter.state_dict(),
                       optim_state_dict=optimizer_by_name(state.pop("optimizer"), names),
                       options=StateDictOptions(full_state_dict=True))
    except (KeyError, RuntimeError, ValueError) as exc:
        raise CheckpointError(f"{folder} does not fit this drafter: "
                              f"{str(exc).splitlines()[0]}") from None
    state["ranks"] = [state.pop("rng")]
    return state


def read_sharded_full(folder: Path, names: list[str]
                      ) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """A DCP checkpoint as full tensors, for a single-process resume: the weights by
    name and the optimizer state keyed by index (``names`` gives the order)."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    check_dcp(folder)  # DCP unpickles; nothing in the folder may be code
    with tempfile.TemporaryDirectory(prefix=".dcp-full-", dir=folder.parent) as tmp:
        full = Path(tmp) / "full.pt"
        try:
            dcp_to_torch_save(folder, full)
            data = torch.load(full, map_location="cpu", weights_only=True)
        except (OSError, RuntimeError, EOFError, ValueError) as exc:
            raise CheckpointError(f"cannot read the sharded checkpoint {folder}: "
                                  f"{str(exc).splitlines()[0]}") from None
    return data["model"], optimizer_by_index(data["optim"], names)


def load_sharded(folder: Path, model: nn.Module, optimizer: torch.optim.Optimizer,
                 world: World) -> dict[str, Any]:
    """Collective: fill the sharded model and optimizer from ``folder`` (any world size
    wrote it, or a single process); returns trainer.pt's state."""
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    from torch.distributed.checkpoint.state_dict_loader import load as dcp_load

    state = read_trainer_state(folder)
    if not is_sharded(state):
        return load_single_into_sharded(folder, state, model, optimizer)
    check_dcp(folder)  # DCP unpickles; nothing in the folder may be code
    model_sd, optim_sd = get_state_dict(model, optimizer)
    target: dict[str, Any] = {"model": model_sd, "optim": optim_sd}
    dcp_load(target, checkpoint_id=str(folder), process_group=world.group)
    set_state_dict(model, optimizer, model_state_dict=target["model"],
                   optim_state_dict=target["optim"])
    return state
