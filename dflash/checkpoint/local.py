"""One process's training checkpoint: an fp32 drafter export of the master weights plus
``trainer.pt``; and the ``trainer.pt`` reader both kinds of checkpoint share."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import torch

from dflash.checkpoint.export import load_drafter, write_export
from dflash.checkpoint.layout import (
    LATEST_NAME,
    TRAINER_STATE_NAME,
    fresh_dir_beside,
    prune,
    replace_dir,
    step_folder,
)
from dflash.config import DrafterConfig
from dflash.errors import CheckpointError
from dflash.model import DFlashDrafter
from envguard.atomic import write_text_atomic


def save_training_checkpoint(out: Path, step: int, cfg: DrafterConfig,
                             master_weights: dict[str, torch.Tensor], state: dict[str, Any],
                             keep: int = 2) -> Path:
    """OUT/checkpoints/step-XXXXXXXX/ (fp32 export of the master weights + trainer.pt),
    then ``latest``; only the newest ``keep`` checkpoints stay."""
    final = step_folder(out, step)
    tmp = fresh_dir_beside(final)
    try:
        write_export(cfg, master_weights, tmp, torch.float32)
        torch.save(state, tmp / TRAINER_STATE_NAME)
        with open(tmp / TRAINER_STATE_NAME, "rb") as fh:
            os.fsync(fh.fileno())
        replace_dir(tmp, final)
        write_text_atomic(final.parent / LATEST_NAME, final.name + "\n")
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(exc, OSError):
            raise CheckpointError(f"cannot write {final}: {exc.strerror or exc}") from None
        raise
    prune(final.parent, keep, final)
    return final


def read_trainer_state(folder: Path) -> dict[str, Any]:
    """``trainer.pt`` of a checkpoint folder, either kind (one process or DCP)."""
    try:
        state = torch.load(folder / TRAINER_STATE_NAME, map_location="cpu", weights_only=True)
    except (OSError, RuntimeError, EOFError, ValueError) as exc:
        raise CheckpointError(f"cannot read {folder / TRAINER_STATE_NAME}: {exc}") from None
    if not isinstance(state, dict) or "step" not in state:
        raise CheckpointError(f"{folder / TRAINER_STATE_NAME} is not a dflash trainer state")
    return state


def load_training_checkpoint(folder: Path, device: str | torch.device
                             ) -> tuple[DFlashDrafter, dict[str, Any]]:
    """The fp32 drafter and the trainer state saved by :func:`save_training_checkpoint`."""
    drafter = load_drafter(folder, device=device, dtype=torch.float32)
    return drafter, read_trainer_state(folder)
