"""AdamW on fp32 master weights: with bf16 parameters the masters follow exactly the
fp32 AdamW trajectory (given the same gradients) and the model holds their bf16 copy."""

from __future__ import annotations

import copy

import torch
from torch import nn

from dflash.optim import MasterAdamW
from tests.dflash.launch import torchrun


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


def _mixed(seed: int = 0) -> tuple[nn.Module, MasterAdamW]:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 3)).to(torch.bfloat16)
    return model, MasterAdamW(model, lr=1e-2, betas=(0.9, 0.99), weight_decay=0.1)


def _steps(model: nn.Module, opt: MasterAdamW, seeds: range) -> None:
    for seed in seeds:
        gen = torch.Generator().manual_seed(seed)
        for p in model.parameters():
            p.grad = torch.randn(p.shape, generator=gen).to(torch.bfloat16)
        opt.step(1e-2 * (1 + seed % 3), 0.5)


def test_bf16_state_is_torchs_adamw_state_and_resumes_exactly() -> None:
    """The bf16 path keeps its moments and step count in torch's AdamW state (what the
    checkpoints save), and an optimizer that loads an older state counts its bias
    correction from that state's step, not from the steps it took itself."""
    model, opt = _mixed()
    _steps(model, opt, range(3))
    saved = copy.deepcopy(opt.state_dict())
    masters = {k: v.clone() for k, v in opt.master_state_dict().items()}
    assert sorted(saved["state"][0]) == ["exp_avg", "exp_avg_sq", "step"]
    assert all(s["step"].item() == 3.0 for s in saved["state"].values())
    _steps(model, opt, range(3, 5))
    expected = {k: v.clone() for k, v in opt.master_state_dict().items()}

    _steps(model, opt, range(5, 9))  # this optimizer is now 9 steps in
    opt.load_master(masters)
    opt.load_state_dict(copy.deepcopy(saved))  # loading keeps the tensors it is given
    _steps(model, opt, range(3, 5))
    for name, m in opt.master_state_dict().items():
        torch.testing.assert_close(m, expected[name], rtol=0, atol=0)

    # torch's own AdamW continues from the same state to the same masters.
    _, ref = _mixed()
    ref.load_master(masters)
    torch_opt = torch.optim.AdamW(ref.master, lr=1e-2, betas=(0.9, 0.99), weight_decay=0.1)
    torch_opt.load_state_dict(copy.deepcopy(saved))
    for seed in range(3, 5):
        gen = torch.Generator().manual_seed(seed)
        for m in ref.master:
            m.grad = torch.randn(m.shape, generator=gen).to(torch.bfloat16).float()
        torch.nn.utils.clip_grad_norm_(ref.master, 0.5)
        for group in torch_opt.param_groups:
            group["lr"] = 1e-2 * (1 + seed % 3)
        torch_opt.step()
    for m, name in zip(ref.master, ref.names, strict=True):
        torch.testing.assert_close(m.detach(), expected[name], rtol=0, atol=0)


def test_bf16_clip_scales_by_the_norm_of_every_gradient() -> None:
    model, opt = _mixed()
    first, second = model[0].weight, model[1].bias
    for p in model.parameters():
        p.grad = None
    first.grad = torch.full_like(first, 3.0)  # 64 entries: norm 24
    second.grad = torch.full_like(second, 4.0)  # the rest have no gradient
    norm = opt.step(1e-2, 1.0)
    torch.testing.assert_close(norm, torch.tensor((64 * 9.0 + 3 * 16.0) ** 0.5))
    assert all(p.grad is None for p in model.parameters())
    # A parameter without a gradient still decays and counts the step.
    state = opt.adamw.state[opt.master[1]]
    assert state["step"].item() == 1.0 and not state["exp_avg"].any()


SHARDED = '''
import sys
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Shard
from dflash.optim import MasterAdamW
from tests.dflash.launch import torchrun

dist.init_process_group("gloo")
rank = dist.get_rank()
mesh = init_device_mesh("cpu", (2,))


def shard(full):
    local = torch.chunk(full, 2, dim=0)[rank].contiguous()
    return DTensor.from_local(local, mesh, [Shard(0)], run_check=False, shape=full.shape,
                              stride=full.stride())


def build(sharded):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 6), nn.Linear(6, 3)).to(torch.bfloat16)
    if sharded:
        for mod in model:
            for name, p in list(mod.named_parameters()):
                setattr(mod, name, nn.Parameter(shard(p.detach())))
    return model, MasterAdamW(model, lr=1e-2, betas=(0.9, 0.99), weight_decay=0.1)


whole, one = build(False)
parts, two = build(True)
for seed in range(4):
    gen = torch.Generator().manual_seed(seed)
    for p, q in zip(whole.parameters(), parts.parameters(), strict=True):
        g = torch.randn(p.shape, generator=gen).to(torch.bfloat16)
        p.grad, q.grad = g, shard(g)
    n1, n2 = one.step(1e-2, 0.5), two.step(1e-2, 0.5)
    torch.testing.assert_close(n2, n1)
    assert n1.item() > 0.5  # the clip is in force
for m1, m2 in zip(one.master, two.master, strict=True):
    torch.testing.assert_close(m2.full_tensor(), m1)
for p1, p2 in zip(whole.parameters(), parts.parameters(), strict=True):
    assert torch.equal(p2.full_tensor(), p1) or torch.testing.assert_close(
        p2.full_tensor().float(), p1.float(), rtol=0.01, atol=1e-3) is None
print("rank", rank, "ok")
dist.destroy_process_group()
'''


def test_sharded_bf16_steps_as_one_process_over_the_whole_tensors(tmp_path) -> None:
    """Two ranks (gloo), each parameter sharded in rows as FSDP2 shards it: the clip's norm
    is the whole model's (summed over the ranks), and the masters step as one process
    stepping the whole tensors."""
    script = tmp_path / "sharded.py"
    script.write_text(SHARDED)
    proc = torchrun(2, str(script), timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("ok") == 2


def test_the_kernel_is_asked_for_only_where_it_can_run(monkeypatch) -> None:
    """``kernel=False`` (``--set optimizer_kernel=off``) keeps torch operators even where
    the kernel could run; fp32 parameters never use it; here (a CPU) nothing does."""
    import dflash.optim as optim

    asked: list[int] = []

    def fake(params: list[torch.Tensor]) -> optim.Update:
        asked.append(len(params))
        return optim.update_reference_

    monkeypatch.setattr(optim, "_kernel_for", fake)
    model = nn.Linear(4, 4).to(torch.bfloat16)
    assert MasterAdamW(model, lr=1e-3, betas=(0.9, 0.99), weight_decay=0.0).kernel is not None
    assert MasterAdamW(model, lr=1e-3, betas=(0.9, 0.99), weight_decay=0.0,
                       kernel=False).kernel is None
    assert MasterAdamW(nn.Linear(4, 4), lr=1e-3, betas=(0.9, 0.99),
                       weight_decay=0.0).kernel is None
    assert asked == [2]
    monkeypatch.undo()
    assert optim._kernel_for([p.detach() for p in model.parameters()]) is None
