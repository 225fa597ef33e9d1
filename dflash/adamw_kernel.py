"""The mixed-precision AdamW update as one pass over memory: a Triton kernel on CUDA.

With bf16 parameters, :class:`dflash.optim.MasterAdamW` keeps fp32 masters. Done with
torch's own operators, a step reads and writes each parameter's bytes several times: the
bf16 gradient made fp32 (6 bytes a parameter), the clip's norm and multiply (12), the
fused AdamW (28), the masters copied back to bf16 (6): 52 bytes a parameter, about 55 GB
a step for the 8B shape's 1.05 B drafter parameters, some 18 ms of an H100's bandwidth
against a 289 ms step. :func:`adamw_update_` reads the bf16 gradient, the master and both
moments once and writes the master, the moments and the bf16 parameter once: 28 bytes,
plus 2 for the norm that precedes it (docs/BENCHMARKS.md, issue 36).

The arithmetic is torch's fused CUDA AdamW's (decoupled decay, then the moments, then the
bias-corrected step), with the clip applied as a factor read from the device, so nothing
here waits for the GPU. :func:`dflash.optim.update_reference_` is the same update in
torch operators: the CPU path, and the oracle of the GPU test. This module imports
Triton: :class:`dflash.optim.MasterAdamW` imports it only where Triton is installed.
"""

from __future__ import annotations

import contextlib

import torch
import triton
import triton.language as tl
from torch import Tensor

BLOCK = 2048
"""Elements per program: 8 KiB of fp32 master per program, four warps."""


@triton.jit  # type: ignore[untyped-decorator]  # triton ships no type information
def _adamw(grad_ptr, param_ptr, master_ptr, avg_ptr, avg_sq_ptr,  # type: ignore[no-untyped-def]
           coef_ptr, n, decay, beta1, beta2, step_size, bias2_sqrt, eps, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    keep = offs < n
    coef = tl.load(coef_ptr)
    g = tl.load(grad_ptr + offs, mask=keep, other=0.0).to(tl.float32) * coef
    w = tl.load(master_ptr + offs, mask=keep, other=0.0) * decay
    m = beta1 * tl.load(avg_ptr + offs, mask=keep, other=0.0) + (1.0 - beta1) * g
    v = beta2 * tl.load(avg_sq_ptr + offs, mask=keep, other=0.0) + (1.0 - beta2) * g * g
    w = w - step_size * m / (tl.sqrt(v) / bias2_sqrt + eps)
    tl.store(avg_ptr + offs, m, mask=keep)
    tl.store(avg_sq_ptr + offs, v, mask=keep)
    tl.store(master_ptr + offs, w, mask=keep)
    tl.store(param_ptr + offs, w.to(tl.bfloat16), mask=keep)  # nearest even, as torch's


def adamw_update_(grad: Tensor, param: Tensor, master: Tensor, avg: Tensor, avg_sq: Tensor,
                  coef: Tensor, *, lr: float, beta1: float, beta2: float, eps: float,
                  weight_decay: float, step: int) -> None:
    """One AdamW step of ``master`` (fp32) from the bf16 ``grad`` times ``coef`` (a
    one-element fp32 device tensor: the clip), its moments updated in place and the
    result written to the bf16 ``param``. Every tensor contiguous, of one size, on one
    CUDA device (:class:`dflash.optim.MasterAdamW` checks)."""
    n = master.numel()
    if n == 0:
        return
    # Triton launches on the current device (a CPU tensor: Triton's interpreter, the tests)
    with torch.cuda.device(master.device) if master.is_cuda else contextlib.nullcontext():
        _adamw[((n + BLOCK - 1) // BLOCK,)](
            grad, param, master, avg, avg_sq, coef, n, 1.0 - lr * weight_decay, beta1, beta2,
            lr / (1.0 - beta1 ** step), (1.0 - beta2 ** step) ** 0.5, eps, BLOCK=BLOCK,
            num_warps=4)
