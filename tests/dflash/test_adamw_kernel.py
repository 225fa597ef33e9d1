"""dflash/adamw_kernel.py's arithmetic, on a CPU: Triton's interpreter runs the kernel on
CPU tensors (``TRITON_INTERPRET=1``, in a child so that no other test sees it), against
:func:`dflash.optim.update_reference_` and through :class:`dflash.optim.MasterAdamW`.
Runs wherever Triton is installed (CUDA torch installs it; the CPU wheel does not, and
there the GPU test in tests/dflash/test_gpu.py is the only check). The interpreter casts
to bf16 by truncation where the compiled kernel rounds to nearest, so the bf16 copy is
checked here to within one bf16 step of the master; the GPU test checks it exactly."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

from tests.dflash.launch import REPO

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                                reason="Triton is not installed (CPU torch)")

CHECK = '''
import torch
from torch import nn
from dflash import adamw_kernel
from dflash.optim import MasterAdamW, update_reference_

torch.manual_seed(0)
hyper = {"lr": 3e-3, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "weight_decay": 0.1}
for n in (1, adamw_kernel.BLOCK - 1, adamw_kernel.BLOCK, 5000):
    master = torch.randn(n)
    a = [master.to(torch.bfloat16), master.clone(), torch.zeros_like(master),
         torch.zeros_like(master)]
    b = [t.clone() for t in a]
    for step in range(1, 5):
        grad = torch.randn(n).to(torch.bfloat16)
        coef = torch.tensor(0.7)
        adamw_kernel.adamw_update_(grad, *a, coef, step=step, **hyper)
        update_reference_(grad, *b, coef, step=step, **hyper)
    for x, y in zip(a[1:], b[1:], strict=True):
        torch.testing.assert_close(x, y, rtol=2e-6, atol=1e-7)
    assert torch.all((a[0].float() - a[1]).abs() <= a[1].abs() * 2 ** -7), n

opts = []
for kernel in (True, False):
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(64, 96), nn.Linear(96, 33)).to(torch.bfloat16)
    opt = MasterAdamW(model, lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1)
    opt.kernel = adamw_kernel.adamw_update_ if kernel else None
    for seed in range(6):
        gen = torch.Generator().manual_seed(seed)
        for p in model.parameters():
            p.grad = torch.randn(p.shape, generator=gen).to(torch.bfloat16)
        norm = opt.step(1e-3, 1.0)
    opts.append((opt, norm))
(fast, n1), (ref, n2) = opts
torch.testing.assert_close(n1, n2, rtol=1e-6, atol=0)
for x, y in zip(fast.master, ref.master, strict=True):
    torch.testing.assert_close(x, y, rtol=2e-6, atol=1e-7)
assert {s["step"].item() for s in fast.adamw.state.values()} == {6.0}
print("ok")
'''


def test_the_kernel_steps_as_its_torch_reference_in_tritons_interpreter() -> None:
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", CHECK], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "ok"
