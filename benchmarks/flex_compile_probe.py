"""Why does a cold flex_attention compile take minutes at the trainer's shape? Compile the
trainer's exact call (compiled create_block_mask with the DFlash mask, compiled
flex_attention, forward + backward, bf16) cold, for shape variants in parallel processes,
each with its own empty inductor/triton cache, and time each phase:

    python benchmarks/flex_compile_probe.py --out $OUT

Variants change one thing at a time against the Qwen3-1.7B-shaped trainer call
(16 heads, head_dim 128, S = 3072, 512 anchors x 16 = 8192 queries, 11,264 keys).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

VARIANTS = {  # name: (heads, head_dim, seq, anchors)
    "trainer-1.7b": (16, 128, 3072, 512),
    "kv-not-128-multiple": (16, 128, 3080, 512),
    "q-and-kv-not-128-multiple": (16, 128, 3072, 500),
    "head-dim-64": (16, 64, 3072, 512),
}


def child(heads: int, head_dim: int, seq: int, anchors: int) -> dict[str, float]:
    import torch

    from dflash.compilation.kernels import kernels
    from dflash.masks import dflash_block_mask

    dev = torch.device("cuda")
    gen = torch.Generator().manual_seed(0)
    anchor_ids = torch.sort(torch.randperm(seq - 16, generator=gen)[:anchors]).values.to(dev)
    keep = torch.ones(anchors, dtype=torch.bool, device=dev)
    q_len = anchors * 16

    def rnd(n: int) -> torch.Tensor:
        return torch.randn(1, heads, n, head_dim, device=dev, dtype=torch.bfloat16,
                           requires_grad=True)

    q, k, v = rnd(q_len), rnd(seq + q_len), rnd(seq + q_len)
    k_ = kernels(True)
    marks: dict[str, float] = {}
    t0 = time.perf_counter()
    mask = dflash_block_mask(anchor_ids, keep, seq, 16, builder=k_.block_mask_builder)
    torch.cuda.synchronize()
    marks["block_mask_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    out = k_.flex(q, k, v, block_mask=mask)
    torch.cuda.synchronize()
    marks["forward_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    out.float().sum().backward()
    torch.cuda.synchronize()
    marks["backward_s"] = time.perf_counter() - t0
    from torch._dynamo.utils import compile_times

    times = str(compile_times(repr="str", aggregate=True))
    marks["compile_times"] = "\n".join(
        line for line in times.splitlines()
        if any(x in line for x in ("async_compile", "load_by_key_path", "bw_compiler",
                                   "fw_compiler_base")))  # type: ignore[assignment]
    return marks


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("mode", nargs="?", default="parent")
    p.add_argument("--out", default=os.environ.get("OUT", "probe-out"))
    p.add_argument("--variant")
    p.add_argument("--timeout", type=float, default=330.0)
    args = p.parse_args()
    if args.mode == "child":
        print("PROBE " + json.dumps(child(*VARIANTS[args.variant])), flush=True)
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    procs = {}
    start = time.perf_counter()
    for name in VARIANTS:
        root = Path(tempfile.mkdtemp(prefix=f"probe-{name}-"))
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(root / "inductor"),
               "TRITON_CACHE_DIR": str(root / "triton")}
        procs[name] = subprocess.Popen([sys.executable, __file__, "child", "--variant", name],
                                       env=env, stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE, text=True)
    results = {"variants": {k: list(v) for k, v in VARIANTS.items()}}
    for name, proc in procs.items():
        try:
            stdout, stderr = proc.communicate(
                timeout=max(1.0, args.timeout - (time.perf_counter() - start)))
            line = next((x for x in stdout.splitlines() if x.startswith("PROBE ")), None)
            results[name] = (json.loads(line[6:]) if line else
                             {"error": f"exit {proc.returncode}: {stderr.strip()[-500:]}"})
        except subprocess.TimeoutExpired:
            proc.kill()
            results[name] = {"error": f"still compiling after {args.timeout:.0f} s"}
        results[name]["wall_s"] = time.perf_counter() - start
        print(name, json.dumps(results[name])[:400], flush=True)
        (out / "flex_compile_probe.json").write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
