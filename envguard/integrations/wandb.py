"""Log a snapshot to a Weights & Biases run (``pip install wandb``; envguard does not
depend on it).

    run = wandb.init(project="drafter")
    envguard.integrations.wandb.log_snapshot(run)

The snapshot becomes an artifact of type ``environment`` holding ``env.json`` (download
it and ``envguard diff`` it against another run's), and the :func:`summary
<envguard.integrations.summary>` goes into the run's config under ``envguard``. Works
offline (``WANDB_MODE=offline``) as online.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from envguard.errors import IntegrationError
from envguard.integrations import ARTIFACT_FILE, require, summary
from envguard.model import Snapshot

ARTIFACT_TYPE = "environment"


def log_snapshot(run: Any = None, snapshot: Snapshot | None = None, *,
                 artifact_name: str = "envguard-environment") -> Snapshot:
    """Log ``snapshot`` (default: a fresh :func:`envguard.snapshot` of this process's
    environment) to ``run`` (default: ``wandb.run``, the active one) and return it."""
    wandb = require("wandb", "wandb")
    run = run if run is not None else wandb.run
    if run is None:
        raise IntegrationError("no active W&B run: call wandb.init() first, or pass run=")
    if snapshot is None:
        from envguard.api import snapshot as take

        snapshot = take()
    facts = summary(snapshot)
    artifact = wandb.Artifact(name=artifact_name, type=ARTIFACT_TYPE, metadata=facts)
    with tempfile.TemporaryDirectory(prefix="envguard-wandb-") as tmp:
        path = snapshot.write(Path(tmp) / ARTIFACT_FILE)
        artifact.add_file(str(path), name=ARTIFACT_FILE)  # copied into W&B's staging area
        run.log_artifact(artifact)
    run.config.update({"envguard": facts}, allow_val_change=True)
    return snapshot
