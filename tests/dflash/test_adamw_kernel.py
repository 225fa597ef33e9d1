"""dflash/adamw_kernel.py's arithmetic, on a CPU: Triton's interpreter runs the kernel on
CPU tensors (``TRITON_INTERPRET=1``, in a child so that no other test sees it) through the
GPU test's own check (tests/dflash/adamw_check.py), against
:func:`dflash.optim.update_reference_` and through :class:`dflash.optim.MasterAdamW`.
Runs wherever Triton is installed (CUDA torch installs it; the CPU wheel does not, and
there the GPU test in tests/dflash/test_gpu.py is the only check)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

from tests.dflash.launch import REPO

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                                reason="Triton is not installed (CPU torch)")

CHECK = """
import torch
from dflash import adamw_kernel
from tests.dflash.adamw_check import check_kernel_against_reference

check_kernel_against_reference(
    torch.device("cpu"), (1, adamw_kernel.BLOCK - 1, adamw_kernel.BLOCK, 5000), exact_bf16=False)
print("ok")
"""


def test_the_kernel_steps_as_its_torch_reference_in_tritons_interpreter() -> None:
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", CHECK], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "ok"
