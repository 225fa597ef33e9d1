"""The synthetic data's decode loop by itself and beside the compiler's import (GPU).

    for s in eager captured eager captured; do python3 benchmarks/data_beside.py --steps $s; done

One fresh process a run: the 8B-shaped target (random weights, bf16), 512 prompts of 16
ids, 96 greedy tokens, as the trainer's data phase. A thread runs
:func:`dflash.decoding.generate.generate_responses` while the main thread imports dynamo
and inductor (what the drafter's placing spends its time on); then the loop runs again
alone. ``--steps eager`` keeps the eager loop (:mod:`dflash.decoding.batched` made not to
apply), ``captured`` the CUDA-graph steps. Prints one JSON line of seconds.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", choices=["eager", "captured"], required=True)
    args = p.parse_args()
    import torch

    from dflash.decoding import batched, generate
    from dflash.target import load_target

    target = load_target("qwen3-8b-shape", device="cuda", dtype=torch.bfloat16)
    prompts = generate.synthetic_prompts(512, vocab_size=target.vocab_size, length=16, seed=0,
                                         exclude=(target.mask_token_id,))
    if args.steps == "eager":
        batched.applies = lambda *a: False  # type: ignore[assignment]
    torch.cuda.synchronize()
    out: dict[str, float | str] = {"steps": args.steps}

    def loop() -> None:
        t0 = time.perf_counter()
        generate.generate_responses(target, prompts, max_new_tokens=96, batch_size=512)
        out["loop_beside_s"] = round(time.perf_counter() - t0, 3)

    thread = threading.Thread(target=loop)
    thread.start()
    t0 = time.perf_counter()
    import torch._dynamo
    import torch._inductor.compile_fx
    out["import_beside_s"] = round(time.perf_counter() - t0, 3)
    thread.join()
    t0 = time.perf_counter()
    generate.generate_responses(target, prompts, max_new_tokens=96, batch_size=512)
    out["loop_alone_s"] = round(time.perf_counter() - t0, 3)
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
