"""What a drafter export and a run's checkpoints look like on disk, and how a folder is put
in place. Plain Python (no torch), so the commands check their folders before loading.

* **Drafter export** (``DIR/config.json`` + ``DIR/model.safetensors``): the published
  DFlash layout (``architectures: ["DFlashDraftModel"]``, ``block_size``,
  ``num_target_layers``, ``dflash_config.{mask_token_id,target_layer_ids}`` and the
  Qwen3 fields), with z-lab's parameter names, so it loads where DFlash drafters load.
* **Training checkpoint** (``OUT/checkpoints/step-00000123/``): written into a hidden
  temporary folder and renamed into place, then ``OUT/checkpoints/latest`` is replaced
  atomically, so a crash mid-save leaves the previous checkpoint as the latest. One
  process writes a drafter export of the fp32 master weights (:mod:`.local`); torchrun
  writes DCP shards (:mod:`.sharded`); both add ``trainer.pt`` (step, optimizer, RNG
  states, data position).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from dflash.config import DrafterConfig
from dflash.errors import CheckpointError
from dflash.reading import read_json
from envguard.input_file import NotReadable, read_bounded_text

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
TRAINER_STATE_NAME = "trainer.pt"
LATEST_NAME = "latest"
METRICS_NAME = "metrics.jsonl"
EXPORT_NAME = "drafter"


def published_config(cfg: DrafterConfig, dtype_name: str) -> dict[str, Any]:
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
        "torch_dtype": dtype_name,
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


def read_config(folder: Path) -> DrafterConfig:
    """The drafter config of an export folder (its config.json)."""
    try:
        raw = read_json(folder / CONFIG_NAME, CheckpointError, "drafter config")
    except FileNotFoundError:
        raise CheckpointError(f"cannot read {folder / CONFIG_NAME}: "
                              "No such file or directory") from None
    if not isinstance(raw, dict):
        raise CheckpointError(f"{folder / CONFIG_NAME} is not a JSON object")
    return config_from_published(raw)


def step_folder(out: Path, step: int) -> Path:
    return out / "checkpoints" / f"step-{step:08d}"


def latest_checkpoint(out: Path) -> Path | None:
    """The checkpoint ``latest`` names, or None when the run has none yet (a ``latest``
    that is not a small regular file, a FIFO say, is a CheckpointError, not a wait)."""
    pointer = out / "checkpoints" / LATEST_NAME
    with contextlib.suppress(FileNotFoundError):
        try:
            name = read_bounded_text(pointer, limit=4096, what="checkpoint pointer").strip()
        except NotReadable as exc:
            raise CheckpointError(str(exc)) from None
        folder = pointer.parent / name
        if not name or "/" in name or not (folder / TRAINER_STATE_NAME).is_file():
            raise CheckpointError(f"{pointer} names {name!r}, which is not a checkpoint")
        return folder
    return None


def earlier_run(out: Path) -> str | None:
    """What an earlier run left in ``out`` (its latest checkpoint, its metrics, its export),
    in a few words for an error; None when it holds none of them."""
    found = []
    try:
        latest = latest_checkpoint(out)
    except CheckpointError:
        found.append(f"{out / 'checkpoints'} (its latest pointer is broken)")
    else:
        if latest is not None:
            found.append(f"a checkpoint ({latest.name})")
    metrics = out / METRICS_NAME
    if metrics.is_file() and metrics.stat().st_size:
        found.append(METRICS_NAME)
    if (out / EXPORT_NAME / CONFIG_NAME).is_file():
        found.append(f"an exported drafter ({EXPORT_NAME}/)")
    return ", ".join(found) or None


def fresh_dir_beside(final: Path) -> Path:
    """An empty hidden folder next to ``final``, to be written and then moved into place."""
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".tmp",
                                     dir=final.parent))
    except OSError as exc:
        raise CheckpointError(f"cannot write {final}: {exc.strerror or exc}") from None


def replace_dir(tmp: Path, final: Path) -> None:
    """Move a finished folder into place; an older folder of that name goes away after."""
    old = None
    if final.exists():
        old = final.with_name(f".{final.name}.old")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(final, old)
    os.replace(tmp, final)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def prune(root: Path, keep: int, newest: Path) -> None:
    """Keep the newest ``keep`` step folders under ``root`` (and always ``newest``)."""
    steps = sorted(p for p in root.glob("step-*") if p.is_dir())
    for old in steps[:-keep] if keep > 0 else []:
        if old != newest:
            shutil.rmtree(old, ignore_errors=True)
