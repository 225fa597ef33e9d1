"""The exported drafter (the published DFlash layout, :mod:`.layout`): write it, read it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from dflash.checkpoint.layout import (
    CONFIG_NAME,
    WEIGHTS_NAME,
    fresh_dir_beside,
    published_config,
    read_config,
    replace_dir,
)
from dflash.config import DrafterConfig
from dflash.errors import CheckpointError
from dflash.model import DFlashDrafter


def write_export(cfg: DrafterConfig, weights: dict[str, torch.Tensor], folder: Path,
                 dtype: torch.dtype, extra: dict[str, Any] | None = None) -> None:
    """config.json + model.safetensors of ``weights`` (cast to ``dtype``) into ``folder``;
    ``extra``: more config.json fields (its ``dflash_config`` merged into the layout's)."""
    tensors = {name: t.detach().to("cpu", dtype).contiguous() for name, t in weights.items()}
    save_file(tensors, str(folder / WEIGHTS_NAME), metadata={"format": "pt"})
    config = published_config(cfg, str(dtype).removeprefix("torch."))
    extra = dict(extra or {})
    config["dflash_config"].update(extra.pop("dflash_config", {}))
    config.update(extra)
    (folder / CONFIG_NAME).write_text(json.dumps(config, indent=2) + "\n")


def export_drafter(drafter: DFlashDrafter, path: str | Path,
                   dtype: torch.dtype = torch.bfloat16,
                   extra: dict[str, Any] | None = None) -> Path:
    """Write config.json + model.safetensors into ``path`` atomically (as one folder);
    ``extra`` as :func:`write_export`'s."""
    final = Path(path)
    tmp = fresh_dir_beside(final)
    try:
        write_export(drafter.cfg, drafter.state_dict(), tmp, dtype, extra)
        replace_dir(tmp, final)
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(exc, OSError):
            raise CheckpointError(f"cannot write {final}: {exc.strerror or exc}") from None
        raise
    return final


def load_drafter(path: str | Path, *, device: str | torch.device = "cpu",
                 dtype: torch.dtype = torch.float32) -> DFlashDrafter:
    """A drafter from an export folder; every tensor must be present with its shape."""
    folder = Path(path)
    cfg = read_config(folder)
    try:
        tensors = load_file(str(folder / WEIGHTS_NAME), device="cpu")
    except (OSError, SafetensorError) as exc:
        raise CheckpointError(f"cannot read {folder / WEIGHTS_NAME}: {exc}") from None
    drafter = DFlashDrafter(cfg)
    expected = drafter.state_dict()
    missing = sorted(set(expected) - set(tensors))
    unexpected = sorted(set(tensors) - set(expected))
    if missing or unexpected:
        raise CheckpointError(f"{folder / WEIGHTS_NAME} does not match its config: "
                              f"missing {missing[:3]}, unexpected {unexpected[:3]}")
    for name, t in tensors.items():
        if t.shape != expected[name].shape:
            raise CheckpointError(f"{folder / WEIGHTS_NAME}: {name} has shape "
                                  f"{tuple(t.shape)}, config says {tuple(expected[name].shape)}")
    drafter.load_state_dict(tensors)
    return drafter.to(device=device, dtype=dtype)
