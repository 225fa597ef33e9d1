"""Saving and loading: the exported drafter and the resumable training state.

Two formats:

* **Drafter export** (``DIR/config.json`` + ``DIR/model.safetensors``): the published
  DFlash layout (``architectures: ["DFlashDraftModel"]``, ``block_size``,
  ``num_target_layers``, ``dflash_config.{mask_token_id,target_layer_ids}`` and the
  Qwen3 fields), with z-lab's parameter names, so it loads where DFlash drafters load.
* **Training checkpoint** (``OUT/checkpoints/step-00000123/``): a drafter export in
  fp32 (the master weights) plus ``trainer.pt`` with the optimizer, scheduler, step,
  RNG states and data position. A checkpoint is written into a hidden temporary
  folder and renamed into place, then ``OUT/checkpoints/latest`` is replaced
  atomically, so a crash mid-save leaves the previous checkpoint as the latest.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from dflash.config import DrafterConfig
from dflash.model import DFlashDrafter
from envguard.atomic import write_text_atomic

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
TRAINER_STATE_NAME = "trainer.pt"
LATEST_NAME = "latest"


class CheckpointError(Exception):
    """A checkpoint that cannot be read or written; the message is one line."""


def published_config(cfg: DrafterConfig, dtype: torch.dtype) -> dict[str, Any]:
    """config.json in the layout z-lab's DFlashDraftModel, SGLang and vLLM read."""
    return {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "block_size": cfg.block_size,
        "num_target_layers": cfg.num_target_layers,
        "dflash_config": {"mask_token_id": cfg.mask_token_id,
                          "target_layer_ids": list(cfg.target_layer_ids)},
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim,
        "rope_theta": cfg.rope_theta,
        "rope_scaling": None,
        "rms_norm_eps": cfg.rms_eps,
        "vocab_size": cfg.vocab_size,
        "hidden_act": "silu",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "tie_word_embeddings": False,
        "use_sliding_window": False,
        "sliding_window": None,
        "max_window_layers": cfg.num_layers,
        "torch_dtype": str(dtype).removeprefix("torch."),
        # Not read by inference engines; the trainer keeps its loss decay here.
        "dflash_training": {"gamma": cfg.gamma},
    }


def config_from_published(d: dict[str, Any]) -> DrafterConfig:
    """The inverse of :func:`published_config`; also reads z-lab's released configs."""
    try:
        dflash = d["dflash_config"]
        return DrafterConfig(
            hidden_size=d["hidden_size"], intermediate_size=d["intermediate_size"],
            num_layers=d["num_hidden_layers"], num_heads=d["num_attention_heads"],
            num_kv_heads=d["num_key_value_heads"],
            head_dim=d.get("head_dim") or d["hidden_size"] // d["num_attention_heads"],
            rope_theta=float(d.get("rope_theta", 10_000.0)), rms_eps=float(d["rms_norm_eps"]),
            block_size=d["block_size"], mask_token_id=dflash["mask_token_id"],
            target_layer_ids=tuple(dflash["target_layer_ids"]),
            num_target_layers=d["num_target_layers"], vocab_size=d["vocab_size"],
            gamma=float(d.get("dflash_training", {}).get("gamma", 7.0)))
    except KeyError as exc:
        raise CheckpointError(f"config.json lacks the DFlash field {exc}") from None
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"config.json is not a valid DFlash config: {exc}") from None


def _fresh_dir_beside(final: Path) -> Path:
    final.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent))


def _replace_dir(tmp: Path, final: Path) -> None:
    """Move a finished folder into place; an older folder of that name goes away after."""
    old = None
    if final.exists():
        old = final.with_name(f".{final.name}.old")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(final, old)
    os.replace(tmp, final)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _write_export(cfg: DrafterConfig, weights: dict[str, torch.Tensor], folder: Path,
                  dtype: torch.dtype) -> None:
    tensors = {name: t.detach().to("cpu", dtype).contiguous() for name, t in weights.items()}
    save_file(tensors, str(folder / WEIGHTS_NAME), metadata={"format": "pt"})
    text = json.dumps(published_config(cfg, dtype), indent=2) + "\n"
    (folder / CONFIG_NAME).write_text(text)


def export_drafter(drafter: DFlashDrafter, path: str | Path,
                   dtype: torch.dtype = torch.bfloat16) -> Path:
    """Write config.json + model.safetensors into ``path`` atomically (as one folder)."""
    final = Path(path)
    try:
        tmp = _fresh_dir_beside(final)
    except OSError as exc:
        raise CheckpointError(f"cannot write {final}: {exc.strerror or exc}") from None
    try:
        _write_export(drafter.cfg, drafter.state_dict(), tmp, dtype)
        _replace_dir(tmp, final)
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
    try:
        raw = json.loads((folder / CONFIG_NAME).read_text())
    except OSError as exc:
        raise CheckpointError(f"cannot read {folder / CONFIG_NAME}: "
                              f"{exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{folder / CONFIG_NAME} is not JSON: {exc.msg} "
                              f"(line {exc.lineno})") from None
    if not isinstance(raw, dict):
        raise CheckpointError(f"{folder / CONFIG_NAME} is not a JSON object")
    cfg = config_from_published(raw)
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


def save_training_checkpoint(out: Path, step: int, cfg: DrafterConfig,
                             master_weights: dict[str, torch.Tensor], state: dict[str, Any],
                             keep: int = 2) -> Path:
    """OUT/checkpoints/step-XXXXXXXX/ (fp32 export of the master weights + trainer.pt),
    then ``latest``; only the newest ``keep`` checkpoints stay."""
    root = out / "checkpoints"
    final = root / f"step-{step:08d}"
    try:
        tmp = _fresh_dir_beside(final)
    except OSError as exc:
        raise CheckpointError(f"cannot write {final}: {exc.strerror or exc}") from None
    try:
        _write_export(cfg, master_weights, tmp, torch.float32)
        torch.save(state, tmp / TRAINER_STATE_NAME)
        with open(tmp / TRAINER_STATE_NAME, "rb") as fh:
            os.fsync(fh.fileno())
        _replace_dir(tmp, final)
        write_text_atomic(root / LATEST_NAME, final.name + "\n")
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(exc, OSError):
            raise CheckpointError(f"cannot write {final}: {exc.strerror or exc}") from None
        raise
    _prune(root, keep, final)
    return final


def _prune(root: Path, keep: int, newest: Path) -> None:
    steps = sorted(p for p in root.glob("step-*") if p.is_dir())
    for old in steps[:-keep] if keep > 0 else []:
        if old != newest:
            shutil.rmtree(old, ignore_errors=True)


def latest_checkpoint(out: Path) -> Path | None:
    """The checkpoint ``latest`` names, or None when the run has none yet."""
    pointer = out / "checkpoints" / LATEST_NAME
    with contextlib.suppress(FileNotFoundError):
        name = pointer.read_text().strip()
        folder = pointer.parent / name
        if not name or "/" in name or not (folder / TRAINER_STATE_NAME).is_file():
            raise CheckpointError(f"{pointer} names {name!r}, which is not a checkpoint")
        return folder
    return None


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
