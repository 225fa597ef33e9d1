"""dflash/adamw_kernel.py against :func:`dflash.optim.update_reference_`, on any device:
the GPU test (tests/dflash/test_gpu.py, the compiled kernel) and the CPU run in Triton's
interpreter (tests/dflash/test_adamw_kernel.py) call this one check. The interpreter casts
to bf16 by truncation where the compiled kernel rounds to nearest, so there the bf16 copy
is checked to within one bf16 step of the master (``exact_bf16=False``)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from dflash import adamw_kernel
from dflash.optim import MasterAdamW, update_reference_


def check_kernel_against_reference(device: torch.device, sizes: Sequence[int], *,
                                   exact_bf16: bool) -> None:
    """Tensors of ``sizes`` elements stepped four times by both, the clip factor read from
    the device; then MasterAdamW on a bf16 model, kernel against reference, six steps,
    through the norm."""
    torch.manual_seed(0)
    hyper = {"lr": 3e-3, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "weight_decay": 0.1}
    for n in sizes:
        master = torch.randn(n, device=device)
        a = [master.to(torch.bfloat16), master.clone(), torch.zeros_like(master),
             torch.zeros_like(master)]
        b = [t.clone() for t in a]
        for step in range(1, 5):
            grad = torch.randn(n, device=device).to(torch.bfloat16)
            coef = torch.tensor(0.7, device=device)
            adamw_kernel.adamw_update_(grad, *a, coef, step=step, **hyper)
            update_reference_(grad, *b, coef, step=step, **hyper)
        for x, y in zip(a[1:], b[1:], strict=True):
            torch.testing.assert_close(x, y, rtol=2e-6, atol=1e-7)
        if exact_bf16:
            assert torch.equal(a[0], a[1].to(torch.bfloat16))
        else:
            assert torch.all((a[0].float() - a[1]).abs() <= a[1].abs() * 2 ** -7), n

    opts = []
    for kernel in (True, False):
        torch.manual_seed(1)
        model = nn.Sequential(nn.Linear(64, 96), nn.Linear(96, 33)).to(device, torch.bfloat16)
        opt = MasterAdamW(model, lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1)
        opt.kernel = adamw_kernel.adamw_update_ if kernel else None
        for seed in range(6):
            gen = torch.Generator(device=device).manual_seed(seed)
            for p in model.parameters():
                p.grad = torch.randn(p.shape, generator=gen, device=device).to(torch.bfloat16)
            norm = opt.step(1e-3, 1.0)
        opts.append((opt, norm))
    (fast, n1), (ref, n2) = opts
    torch.testing.assert_close(n1, n2, rtol=1e-6, atol=0)
    for x, y in zip(fast.master, ref.master, strict=True):
        torch.testing.assert_close(x, y, rtol=2e-6, atol=1e-7)
    assert {s["step"].item() for s in fast.adamw.state.values()} == {6.0}
