"""``--deep``: import torch in a crash-isolated subprocess of the target interpreter."""

from __future__ import annotations

import json
import os
from pathlib import Path

from envguard.model import Deep
from envguard.probe import _deep_probe
from envguard.probe.commands import run

DEEP_TIMEOUT_S = 180.0


def collect(python: str, *, timeout: float = DEEP_TIMEOUT_S) -> Deep:
    env = dict(os.environ)
    result = run([python, str(Path(_deep_probe.__file__))], timeout=timeout, env=env)
    if not result.ok:
        return Deep(ok=False, error=f"import torch failed: {result.error}")
    try:
        data = json.loads(result.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return Deep(ok=False, error="import torch printed no facts")
    caps = data.get("device_capability") or []
    return Deep(
        ok=True,
        error=data.get("error"),
        torch_version=data.get("torch_version"),
        cuda_available=data.get("cuda_available"),
        device_count=data.get("device_count"),
        device_capability=[str(c) for c in caps],
        cudnn_version=data.get("cudnn_version"),
        nccl_version=data.get("nccl_version"),
        config=data.get("config"),
        torch_key=data.get("torch_key"),
        seconds=data.get("seconds"),
    )
