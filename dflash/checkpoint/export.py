"""The exported drafter (the published DFlash layout, :mod:`.layout`): write it, read it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
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
    """A drafter from an export folder; every tensor must be present with its shape
    (:func:`check_weights`, before the drafter is built)."""
    folder = Path(path)
    cfg = read_config(folder)
    check_weights(folder, cfg)
    try:
        tensors = load_file(str(folder / WEIGHTS_NAME), device="cpu")
    except (OSError, SafetensorError) as exc:
        raise CheckpointError(f"cannot read {folder / WEIGHTS_NAME}: {exc}") from None
    drafter = DFlashDrafter(cfg)
    drafter.load_state_dict(tensors)
    return drafter.to(device=device, dtype=dtype)


def check_weights(folder: Path, cfg: DrafterConfig) -> None:
    """The folder's weights hold exactly the tensors of ``cfg``'s drafter, each with its
    shape: read from the file's header (no tensor loaded) against the drafter built on the
    meta device (no memory), so a config.json that does not describe its weights, say
    one edited to 10^8 layers or a hidden size of 10^6, is one CheckpointError, not a
    process building a model that cannot fit."""
    file = folder / WEIGHTS_NAME
    try:
        with safe_open(str(file), framework="pt", device="cpu") as f:
            held = {name: tuple(f.get_slice(name).get_shape())
                    for name in f.keys()}  # noqa: SIM118  (safe_open is not a mapping)
    except (OSError, SafetensorError) as exc:
        raise CheckpointError(f"cannot read {file}: {exc}") from None
    layers = {name.split(".")[1] for name in held if name.startswith("layers.")}
    if len(layers) != cfg.num_layers:  # before even the meta drafter: its layers cost time
        raise CheckpointError(f"{file} holds {len(layers)} drafter layers, its "
                              f"{CONFIG_NAME} says {cfg.num_layers}")
    with torch.device("meta"):
        expected = {name: tuple(t.shape) for name, t in DFlashDrafter(cfg).state_dict().items()}
    missing = sorted(set(expected) - set(held))
    unexpected = sorted(set(held) - set(expected))
    if missing or unexpected:
        raise CheckpointError(f"{file} does not match its config: "
                              f"missing {missing[:3]}, unexpected {unexpected[:3]}")
    for name, shape in held.items():
        if shape != expected[name]:
            raise CheckpointError(f"{file}: {name} has shape {shape}, config says "
                                  f"{expected[name]}")
