"""A training run's progress: what a checkpoint saves besides the model's shape, and what
a resume restores so the run continues exactly (:mod:`dflash.checkpoint.resume` writes
and reads it, in one process or under torchrun)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from dflash.batching import BatchLoader, RankSlice
from dflash.checkpoint import resume as checkpoint
from dflash.config import TrainConfig
from dflash.optim import MasterAdamW


@dataclass(slots=True)
class TrainState:
    """A run's progress: everything a checkpoint saves besides the model's shape, and
    what a resume restores, so the run continues exactly."""

    step: int
    """Optimizer steps done."""
    optimizer: MasterAdamW
    """AdamW with the fp32 master weights."""
    loader: BatchLoader | RankSlice
    """This rank's batch stream."""
    loader_state: dict[str, Any]
    """The stream's position after the last batch the optimizer consumed (the prefetch
    thread is ahead of it)."""
    anchor_gen: torch.Generator
    """This rank's anchor stream (fresh anchors every step)."""

    def state_dict(self, cfg: TrainConfig, device: torch.device,
                   environment: dict[str, str] | None = None) -> dict[str, Any]:
        """trainer.pt's content: step, optimizer, RNG states, data position, config, and
        ``environment`` (env.json's digest) when the run recorded its environment."""
        rng: dict[str, Any] = {"torch": torch.get_rng_state(),
                               "anchor": self.anchor_gen.get_state()}
        if device.type == "cuda":
            rng["cuda"] = torch.cuda.get_rng_state(device)
        state = {"step": self.step, "optimizer": self.optimizer.state_dict(), "rng": rng,
                 "loader": self.loader_state, "config": cfg.to_dict()}
        if environment is not None:
            state["environment"] = dict(environment)
        return state

    def continue_at(self, resumed: checkpoint.Resumed, fresh_seed: int) -> None:
        """The step, this rank's anchor stream (``fresh_seed`` for a rank the checkpoint
        did not have) and the data position of a resumed run."""
        self.step = resumed.step
        if resumed.anchor_rng is not None:
            self.anchor_gen.set_state(resumed.anchor_rng)
        else:
            self.anchor_gen.manual_seed(fresh_seed)
        self.loader.load_state_dict(resumed.loader)
        self.loader_state = self.loader.state_dict()
