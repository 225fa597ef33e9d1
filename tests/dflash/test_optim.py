"""AdamW on fp32 master weights: with bf16 parameters the masters follow exactly the
fp32 AdamW trajectory (given the same gradients) and the model holds their bf16 copy."""

from __future__ import annotations

import torch
from torch import nn

from dflash.optim import MasterAdamW


def test_bf16_params_keep_fp32_masters() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 2)).to(torch.bfloat16)
    ref = [p.detach().float().clone().requires_grad_() for p in model.parameters()]
    ref_opt = torch.optim.AdamW(ref, lr=1e-2, weight_decay=0.0)
    opt = MasterAdamW(model, lr=1e-2, betas=(0.9, 0.999), weight_decay=0.0)
    assert opt.mixed
    for _ in range(5):
        grads = [torch.randn_like(r) for r in ref]
        for p, g in zip(model.parameters(), grads, strict=True):
            p.grad = g.to(torch.bfloat16)
        for r, g in zip(ref, grads, strict=True):
            r.grad = g.to(torch.bfloat16).float()
        torch.nn.utils.clip_grad_norm_(ref, 1.0)
        ref_opt.step()
        opt.step(1e-2, 1.0)
    for m, r, p in zip(opt.master, ref, model.parameters(), strict=True):
        assert m.dtype == torch.float32
        torch.testing.assert_close(m, r.detach(), rtol=0, atol=0)
        assert torch.equal(p, m.to(torch.bfloat16))
        assert p.grad is None
    # Small updates survive in the masters even where bf16 cannot represent them.
    assert any(not torch.equal(m, m.to(torch.bfloat16).float()) for m in opt.master)


def test_fp32_params_are_their_own_masters() -> None:
    model = nn.Linear(4, 4)
    opt = MasterAdamW(model, lr=1e-3, betas=(0.9, 0.999), weight_decay=0.0)
    assert not opt.mixed and opt.master[0] is model.weight
    model.weight.grad = torch.full_like(model.weight, 100.0)
    norm = opt.step(1e-3, 1.0)
    assert norm.item() > 1.0  # the pre-clip norm is what is reported
    assert model.weight.grad is None
