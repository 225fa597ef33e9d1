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
    # Importing torch._inductor creates its cache folder (torch_key needs it imported).
    # A throwaway cache keeps the probe from creating or touching the real caches while
    # the snapshot is walking them; no fact reported here depends on the cache location.
    import tempfile  # only --deep needs it

    with tempfile.TemporaryDirectory(prefix="envguard-deep-") as scratch:
        env = dict(os.environ)
        env["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(scratch, "inductor")
        env["TRITON_CACHE_DIR"] = os.path.join(scratch, "triton")
        result = run([python, "-B", str(Path(_deep_probe.__file__))], timeout=timeout, env=env)
    if not result.ok:
        return Deep(ok=False, error=f"import torch failed: {result.error}")
    try:
        data = json.loads(result.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        data = None
    if not isinstance(data, dict):
        return Deep(ok=False, error="import torch printed no facts")
    caps = data.get("device_capability") or []
    return Deep(
        ok=True,
        error=_text(data.get("error")),
        torch_version=_text(data.get("torch_version")),
        cuda_available=_flag(data.get("cuda_available")),
        device_count=_count(data.get("device_count")),
        device_capability=[str(c) for c in caps] if isinstance(caps, list) else [],
        cudnn_version=_text(data.get("cudnn_version")),
        nccl_version=_text(data.get("nccl_version")),
        config=_text(data.get("config")),
        torch_key=_text(data.get("torch_key")),
        seconds=_seconds(data.get("seconds")),
    )


# The facts come from another process; wrong types would make an invalid snapshot.
def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _flag(value: object) -> bool | None:
    return value if isinstance(value, bool) else None


def _count(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _seconds(value: object) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return None
