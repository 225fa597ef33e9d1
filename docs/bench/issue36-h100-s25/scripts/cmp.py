import sys, json, torch, triton, triton.language as tl
sys.path.insert(0, ".")
from torch import nn
from dflash import adamw_kernel
from dflash.optim import MasterAdamW

@triton.jit
def rn(grad_ptr, param_ptr, master_ptr, avg_ptr, avg_sq_ptr, coef_ptr, n, decay, beta1, beta2, step_size, bias2_sqrt, eps, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    keep = offs < n
    coef = tl.load(coef_ptr)
    g = tl.load(grad_ptr + offs, mask=keep, other=0.0).to(tl.float32) * coef
    w = tl.load(master_ptr + offs, mask=keep, other=0.0) * decay
    m = beta1 * tl.load(avg_ptr + offs, mask=keep, other=0.0) + (1.0 - beta1) * g
    v = beta2 * tl.load(avg_sq_ptr + offs, mask=keep, other=0.0) + (1.0 - beta2) * g * g
    w = w - step_size * tl.math.div_rn(m, tl.math.div_rn(tl.math.sqrt_rn(v), bias2_sqrt) + eps)
    tl.store(avg_ptr + offs, m, mask=keep); tl.store(avg_sq_ptr + offs, v, mask=keep)
    tl.store(master_ptr + offs, w, mask=keep); tl.store(param_ptr + offs, w.to(tl.bfloat16), mask=keep)

def upd_rn(grad, param, master, avg, avg_sq, coef, *, lr, beta1, beta2, eps, weight_decay, step):
    n = master.numel()
    rn[((n + 2047) // 2048,)](grad, param, master, avg, avg_sq, coef, n, 1.0 - lr * weight_decay, beta1, beta2, lr / (1.0 - beta1 ** step), (1.0 - beta2 ** step) ** 0.5, eps, BLOCK=2048, num_warps=4)

@torch.no_grad()
def before_step(params, master, adamw, lr):
    for m, p in zip(master, params): m.grad = p.grad.float()
    torch.nn.utils.clip_grad_norm_(master, 1.0, foreach=True)
    for g in adamw.param_groups: g["lr"] = lr
    adamw.step(); torch._foreach_copy_(params, master)
    for p in params: p.grad = None
    for m in master: m.grad = None

out = {}
dev = torch.device("cuda")
def model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(1024, 4096), nn.Linear(4096, 1024)).to(dev, torch.bfloat16)
ref = model(); rp = list(ref.parameters()); rm = [p.detach().float().clone() for p in rp]
radam = torch.optim.AdamW(rm, lr=6e-4, betas=(0.9, 0.999), weight_decay=0.0, fused=True)
a = model(); oa = MasterAdamW(a, lr=6e-4, betas=(0.9, 0.999), weight_decay=0.0)
b = model(); ob = MasterAdamW(b, lr=6e-4, betas=(0.9, 0.999), weight_decay=0.0); ob.kernel = upd_rn
for step in range(25):
    gen = torch.Generator(device=dev).manual_seed(step)
    gs = [torch.randn(p.shape, generator=gen, device=dev).to(torch.bfloat16) for p in rp]
    for p, g in zip(rp, gs): p.grad = g.clone()
    for p, g in zip(a.parameters(), gs): p.grad = g.clone()
    for p, g in zip(b.parameters(), gs): p.grad = g.clone()
    lr = 6e-4 * (step + 1) / 25
    before_step(rp, rm, radam, lr); oa.step(lr, 1.0); ob.step(lr, 1.0)
for name, o, mod in (("kernel", oa, a), ("kernel_rn", ob, b)):
    rel = max(((x - y).abs() / y.abs().clamp_min(1e-12)).max().item() for x, y in zip(o.master, rm))
    absd = max((x - y).abs().max().item() for x, y in zip(o.master, rm))
    flips = sum((p != q).sum().item() for p, q in zip(mod.parameters(), rp)) / sum(p.numel() for p in rp)
    exact = sum((x != y).sum().item() for x, y in zip(o.master, rm)) / sum(p.numel() for p in rp)
    out[name] = {"max_abs": absd, "max_rel": rel, "bf16_params_differing": flips, "masters_differing": exact}
print(json.dumps(out, indent=1))
