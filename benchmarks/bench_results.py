"""What the GPU benchmark scripts share: NVLink multicast off in every child, and one
JSON file per stage, written atomically as soon as the stage finishes (so a run cut
short by a time limit still returns what it measured)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from envguard.atomic import write_text_atomic

NVLS_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
            "NVSHMEM_DISABLE_NVLS": "1"}


def write(out: Path, name: str, data: Any) -> None:
    write_text_atomic(out / f"{name}.json", json.dumps(data, indent=2, default=str) + "\n")
    print(f"[{time.strftime('%H:%M:%S')}] {name}: {json.dumps(data, default=str)[:700]}",
          flush=True)
