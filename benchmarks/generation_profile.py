"""Where the synthetic data's seconds go at the 8B shape: the trainer's own generation
(512 random 16-token prompts, 96 greedy tokens, one batch) timed, then 8 steps of it under
``torch.profiler`` (the kernels by GPU time, and the host's operators).

    python3 benchmarks/generation_profile.py --out $OUT
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dflash.decoding.generate import generate_responses, synthetic_prompts
from dflash.target import load_target


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--target", default="qwen3-8b-shape")
    p.add_argument("--prompts", type=int, default=512)
    p.add_argument("--tokens", type=int, default=96)
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    target = load_target(args.target, device="cuda", dtype=torch.bfloat16)
    built = time.perf_counter() - t0
    prompts = synthetic_prompts(args.prompts, vocab_size=target.vocab_size, length=16, seed=0,
                                exclude=(target.mask_token_id,))
    times = {}
    for name, tokens in (("first_call_4_tokens", 4), ("warm_full", args.tokens)):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        generate_responses(target, prompts, max_new_tokens=tokens, batch_size=args.prompts)
        torch.cuda.synchronize()
        times[name] = time.perf_counter() - t0
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        generate_responses(target, prompts, max_new_tokens=8, batch_size=args.prompts)
        torch.cuda.synchronize()
    (args.out / "generation-profile.txt").write_text(
        prof.key_averages().table(sort_by="cuda_time_total", row_limit=30) + "\n\n"
        + prof.key_averages().table(sort_by="cpu_time_total", row_limit=20), encoding="utf-8")
    result = {"target": args.target, "prompts": args.prompts, "tokens": args.tokens,
              "build_s": built, **times, "device": torch.cuda.get_device_name(),
              "torch": torch.__version__}
    (args.out / "generation.json").write_text(json.dumps(result, indent=1) + "\n",
                                              encoding="utf-8")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
