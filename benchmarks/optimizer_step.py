"""What an optimizer step costs on bf16 parameters with fp32 masters, three ways.

    python benchmarks/optimizer_step.py --device cuda --out optimizer.json

The parameters are a drafter's trainable ones (``--shape``, a drafter preset of
:data:`dflash.presets.DRAFTER_PRESETS`: ``qwen3-8b``, the 8B shape's 5-layer drafter, 58
tensors, 1.05 B parameters; ``tiny`` for a smoke run on a CPU), bf16, with
random bf16 gradients; each step clips at 1.0 (the clip always in force: the gradients'
norm is far above it). Measured in one process, the three alternating ``--reps`` times,
each the median of ``--steps`` steps timed one by one (synchronized):

before     the step as dflash took it up to the fused kernel, reproduced here as the
           peer: the gradients made fp32, ``clip_grad_norm_``, torch's AdamW (fused on
           CUDA), the masters copied into the bf16 parameters;
reference  :class:`dflash.optim.MasterAdamW` stepping with ``update_reference_`` (torch
           operators, one tensor at a time: the CPU path);
kernel     :class:`dflash.optim.MasterAdamW` with :mod:`dflash.adamw_kernel` (CUDA only).

Before and kernel also as bytes moved a parameter (dflash/adamw_kernel.py's count) over
their time.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dflash.model import DFlashDrafter  # noqa: E402
from dflash.optim import MasterAdamW  # noqa: E402
from dflash.presets import DRAFTER_PRESETS  # noqa: E402

BYTES = {"before": 52, "kernel": 30}
"""Bytes read and written a parameter (docs/BENCHMARKS.md, issue 36): before, 6 to make
the gradient fp32, 4 + 8 for the clip's norm and multiply, 28 for the fused AdamW, 6 to
copy back; the kernel, 2 for the norm and 28 (the reference, an operator at a time,
moves several times more)."""


class Before:
    """The earlier step, kept as the peer: fp32 gradients, then torch's own operators."""

    def __init__(self, model: nn.Module) -> None:
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.master = [p.detach().float().clone() for p in self.params]
        fused = all(p.is_cuda for p in self.params)
        self.adamw = torch.optim.AdamW(self.master, lr=1e-4, betas=(0.9, 0.95),
                                       weight_decay=0.01, fused=fused or None)

    @torch.no_grad()
    def step(self, lr: float, clip: float) -> torch.Tensor:
        for m, p in zip(self.master, self.params, strict=True):
            m.grad = p.grad.float()
        norm = torch.nn.utils.clip_grad_norm_(self.master, clip, foreach=True)
        for group in self.adamw.param_groups:
            group["lr"] = lr
        self.adamw.step()
        torch._foreach_copy_(self.params, self.master)
        for p in self.params:
            p.grad = None
        for m in self.master:
            m.grad = None
        return norm


def drafter(preset: str, device: torch.device) -> nn.Module:
    with torch.device(device):
        model = DFlashDrafter(DRAFTER_PRESETS[preset]())
    return model.to(torch.bfloat16)


def timed(step: Callable[[], object], params: list[torch.Tensor], grads: list[torch.Tensor],
          steps: int, device: torch.device) -> float:
    """Median seconds of ``steps`` steps, each given the same gradients."""
    times = []
    for _ in range(steps):
        for p, g in zip(params, grads, strict=True):
            p.grad = g
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--shape", default="qwen3-8b", choices=sorted(DRAFTER_PRESETS))
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    device = torch.device(args.device)
    torch.manual_seed(0)
    model = drafter(args.shape, device)
    params = [q for q in model.parameters() if q.requires_grad]
    grads = [torch.randn_like(q) for q in params]
    n = sum(q.numel() for q in params)
    ways: dict[str, Callable[[], object]] = {}
    before = Before(model)
    ways["before"] = lambda: before.step(1e-4, 1.0)
    reference = MasterAdamW(model, lr=1e-4, betas=(0.9, 0.95), weight_decay=0.01)
    reference.kernel = None
    ways["reference"] = lambda: reference.step(1e-4, 1.0)
    kernel = MasterAdamW(model, lr=1e-4, betas=(0.9, 0.95), weight_decay=0.01)
    if kernel.kernel is not None:
        ways["kernel"] = lambda: kernel.step(1e-4, 1.0)
    runs: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(args.reps):
        for name, step in ways.items():
            runs[name].append(timed(step, params, grads, args.steps, device))
    ms = {name: 1000 * statistics.median(v) for name, v in runs.items()}
    result = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__, "shape": args.shape, "tensors": len(params),
        "parameters": n, "reps": args.reps, "steps": args.steps,
        "ms": ms, "ms_all": {k: [1000 * t for t in v] for k, v in runs.items()},
        "gb_per_s": {k: BYTES[k] * n / (v / 1000) / 1e9 for k, v in ms.items() if k in BYTES},
        "before_over": {k: ms["before"] / v for k, v in ms.items()},
    }
    text = json.dumps(result, indent=2)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
