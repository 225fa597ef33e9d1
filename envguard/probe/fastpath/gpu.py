"""GPU facts without paying for ``nvidia-smi`` on every snapshot.

``nvidia-smi`` takes 0.3-0.5 s on a host without the persistence daemon, which
would be most of a snapshot. Its answer only changes when the driver or the GPUs
do, and both are visible for free in ``/proc/driver/nvidia`` (driver version, and
model, UUID and bus location of every GPU). So the query result, together with
the CUDA driver API version, is memoised in envguard's memo folder, keyed by a
digest of that ``/proc`` state. Without ``/proc/driver/nvidia`` (no driver, or a
container that hides it) nothing is memoised and ``nvidia-smi`` runs every time.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path

from envguard.atomic import write_text_atomic
from envguard.errors import OutputError
from envguard.input_file import SMALL_FILE_BYTES, NotReadable, read_bounded
from envguard.paths import private_folder
from envguard.probe import system
from envguard.probe.commands import CommandResult

PROC_ROOT = "/proc/driver/nvidia"
_VOLATILE = ("IRQ:",)


def driver_state(proc_root: str = PROC_ROOT) -> str | None:
    """The driver version and every GPU's identity as text, or None without a driver."""
    try:
        with open(os.path.join(proc_root, "version"), encoding="utf-8", errors="replace") as fh:
            parts = [fh.read()]
        gpus_dir = os.path.join(proc_root, "gpus")
        for bus in sorted(os.listdir(gpus_dir)):
            with open(os.path.join(gpus_dir, bus, "information"), encoding="utf-8",
                      errors="replace") as fh:
                lines = [ln for ln in fh.read().splitlines() if not ln.startswith(_VOLATILE)]
            parts.append(bus + "\n" + "\n".join(lines))
    except OSError:
        return None
    return "\n".join(parts)


def query(
    env: Mapping[str, str], timeout: float, memo_root: Path, proc_root: str = PROC_ROOT
) -> tuple[CommandResult, str | None]:
    """(the nvidia-smi result, the CUDA driver API version), from the memo when valid."""
    state = driver_state(proc_root)
    path = None
    if state is not None and private_folder(memo_root):
        key = hashlib.sha256(state.encode("utf-8", "surrogateescape")).hexdigest()[:16]
        path = memo_root / f"gpu-{key}.json"
        try:
            memo = json.loads(read_bounded(path, limit=SMALL_FILE_BYTES, what="memo file"))
            if isinstance(memo.get("stdout"), str):
                cuda = memo.get("cuda_driver")
                result = CommandResult(system.NVIDIA_SMI_QUERY, 0, memo["stdout"], "", None)
                return result, cuda if isinstance(cuda, str) else None
        except (OSError, NotReadable, ValueError, AttributeError, RecursionError):
            pass  # absent, not a regular file, damaged: no memo
    result = system.query_gpus(env, timeout)
    cuda = system.cuda_driver_version() if result.ok else None
    if result.ok and path is not None and system.readable(result.stdout):
        from envguard.probe.fastpath.prune import prune

        prune(memo_root)  # at most once a day: memo files unused for a month go
        with contextlib.suppress(OutputError):  # unwritable: only a slower next snapshot
            write_text_atomic(path, json.dumps({"stdout": result.stdout, "cuda_driver": cuda}),
                              state_root=memo_root)
    return result, cuda
