"""Optional integrations: log a snapshot to an experiment tracker.

envguard depends on none of them; each module imports its library when called and
raises :class:`envguard.errors.IntegrationError` (one line naming the install command)
when it is not installed:

- :mod:`envguard.integrations.wandb`: ``log_snapshot(run)`` for Weights & Biases;
- :mod:`envguard.integrations.mlflow`: ``log_snapshot()`` for MLflow.

Both log the snapshot file itself (``env.json``, byte for byte what
:meth:`envguard.model.Snapshot.write` writes, so ``envguard diff`` reads it back) and the
short :func:`summary` as the run's config or params.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from envguard.errors import IntegrationError
from envguard.model import Snapshot

ARTIFACT_FILE = "env.json"


def summary(snapshot: Snapshot) -> dict[str, str]:
    """The few facts worth a column in a run table: torch build, CUDA, driver, GPUs,
    Python, the package count and the snapshot's digest."""
    torch = snapshot.torch
    gpus = sorted({g.name for g in snapshot.system.gpus})
    facts = {
        "torch": torch.version or "not installed",
        "torch_git": (torch.git_version or "")[:12],
        "cuda": torch.cuda or ("none" if torch.version else ""),
        "driver": snapshot.system.driver_version or "",
        "gpus": f"{len(snapshot.system.gpus)} x {', '.join(gpus)}" if gpus else "0",
        "python": snapshot.interpreter.version,
        "packages": str(len(snapshot.packages)),
        "sha256": snapshot.sha256,
    }
    return {k: v for k, v in facts.items() if v}


def require(module: str, install: str) -> ModuleType:
    """Import an optional library, or one line saying how to install it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise IntegrationError(f"{module} is not installed ({exc}); install it with "
                               f"`pip install {install}` to log envguard snapshots") from None
