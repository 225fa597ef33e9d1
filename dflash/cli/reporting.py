"""``dflash-train --report-to wandb|tensorboard|none``: every metrics.jsonl record also goes
to Weights & Biases (``wandb.init`` / ``wandb.log``) or to TensorBoard
(``torch.utils.tensorboard.SummaryWriter``, which needs the ``tensorboard`` package), as
the Hugging Face Trainer's option of the same name does. Rank 0 alone reports.

Neither library is a dependency: each is imported when a run reports to it, and
:func:`check_installed` refuses a missing one in one line (exit 2) before anything is
loaded, instead of a traceback after the target was built.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from typing import Any, Protocol

from dflash.errors import MissingExtraError

CHOICES = ("none", "wandb", "tensorboard")
NEEDS = {"wandb": "wandb", "tensorboard": "tensorboard"}
"""What each choice imports, by the name of its top-level module."""
TENSORBOARD_DIR = "tensorboard"
"""SummaryWriter's folder inside the run folder."""


def installed(module: str) -> bool:
    if module in sys.modules:
        return True
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def check_installed(choice: str) -> None:
    """MissingExtraError (exit 2) when ``choice`` needs a library this interpreter lacks."""
    module = NEEDS.get(choice)
    if module is not None and not installed(module):
        raise MissingExtraError(
            f"--report-to {choice}: {module} is not installed in this environment "
            f"(pip install {module}, or --report-to none)")


def scalars(record: dict[str, Any]) -> dict[str, float]:
    """The numbers of a metrics record, flat: ``acc`` (per block position) becomes
    ``acc/1`` .. ``acc/B-1``; ``step`` and what is not a number are left out."""
    out: dict[str, float] = {}
    for key, value in record.items():
        if key == "step":
            continue
        if isinstance(value, list):
            out.update({f"{key}/{i}": float(v) for i, v in enumerate(value, 1)
                        if isinstance(v, int | float) and not isinstance(v, bool)})
        elif isinstance(value, int | float) and not isinstance(value, bool):
            out[key] = float(value)
    return out


class Reporter(Protocol):
    def log(self, record: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


class WandbReporter:
    """One W&B run: the project from ``WANDB_PROJECT`` (default ``dflash``); wandb reads
    its other ``WANDB_*`` variables (mode, entity, API key) itself."""

    def __init__(self, out: Path, config: dict[str, Any]) -> None:
        self.wandb: Any = importlib.import_module("wandb")
        self.wandb.init(project=os.environ.get("WANDB_PROJECT", "dflash"), dir=str(out),
                        config=config)

    def log(self, record: dict[str, Any]) -> None:
        self.wandb.log(scalars(record), step=int(record["step"]))

    def close(self) -> None:
        self.wandb.finish()


class TensorBoardReporter:
    """Scalars under ``OUT/tensorboard`` (``tensorboard --logdir OUT/tensorboard``)."""

    def __init__(self, out: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer: Any = SummaryWriter(log_dir=str(out / TENSORBOARD_DIR))

    def log(self, record: dict[str, Any]) -> None:
        step = int(record["step"])
        for key, value in scalars(record).items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


def open_reporter(choice: str, out: Path, config: dict[str, Any]) -> Reporter | None:
    """The reporter ``--report-to`` names (None for ``none``), its library imported now."""
    if choice == "wandb":
        return WandbReporter(out, config)
    if choice == "tensorboard":
        return TensorBoardReporter(out)
    return None
