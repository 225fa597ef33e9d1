"""Log a snapshot to the active MLflow run (``pip install mlflow`` or ``mlflow-skinny``;
envguard does not depend on it).

    with mlflow.start_run():
        envguard.integrations.mlflow.log_snapshot()

The snapshot is logged as the artifact ``envguard/env.json`` (byte for byte what
``envguard snapshot`` writes, so ``envguard diff`` reads it back) and the :func:`summary
<envguard.integrations.summary>` as params named ``envguard.<fact>``. Without an active
run MLflow starts one, as its own ``log_*`` functions do.
"""

from __future__ import annotations

from envguard.integrations import ARTIFACT_FILE, require, summary
from envguard.model import Snapshot

PARAM_PREFIX = "envguard."


def log_snapshot(snapshot: Snapshot | None = None, *, artifact_path: str = "envguard"
                 ) -> Snapshot:
    """Log ``snapshot`` (default: a fresh :func:`envguard.snapshot` of this process's
    environment) to the active MLflow run and return it."""
    mlflow = require("mlflow", "mlflow")
    if snapshot is None:
        from envguard.api import snapshot as take

        snapshot = take()
    mlflow.log_text(snapshot.to_json(), f"{artifact_path}/{ARTIFACT_FILE}")
    mlflow.log_params({PARAM_PREFIX + k: v for k, v in summary(snapshot).items()})
    return snapshot
