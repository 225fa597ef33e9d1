"""dflash-generate's batching, this tree against a git ref (A/B): the target's own responses
to a prompt set whose lengths vary, as a real one's do.

    python benchmarks/generate_batches.py --ref HEAD~1 --reps 3                  # CPU
    python3 benchmarks/generate_batches.py --ref-tree DIR --device cuda \\
        --target qwen3-1.7b-shape --prompts 4096 --batch 512 --tokens 64 --reps 2  # GPU

The prompt set mimics the one ``benchmarks/real_target.py`` cuts from source files: most
prompts are ``--length`` tokens long and a share (``--short``, 26 % there) is shorter,
of any length from ``--min-length`` up (a file that ran out first). Each rep runs, for
each tree in turn, a fresh process that builds the target (random weights), warms up on
a few prompts and times ``generate_responses`` (greedy) over the whole set. Reported:
seconds, new tokens/s, the batches run, and how many rows the two trees decoded to the
same tokens (greedy: all of them in float32; in bf16 a batch of another size rounds
differently, and with random weights the logits are close enough for that to change the
argmax, so bf16 rows diverge and ``--dtype float32`` is the check). Prints JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from typing import Any

from abtree import add_ref_options, alternate, probe, ref_name, trees

PROBE = r"""
import json, random, sys, time, zlib, torch
from dflash.decoding.generate import generate_responses
from dflash.target import load_target

name, device = sys.argv[1:3]
n, length, low = int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
short, batch, tokens = float(sys.argv[6]), int(sys.argv[7]), int(sys.argv[8])
dtype = getattr(torch, sys.argv[9])
target = load_target(name, device=device, dtype=dtype)
rng = random.Random(0)
vocab = target.vocab_size - 1
prompts = [[rng.randrange(vocab) for _ in range(rng.randrange(low, length) if rng.random() < short
                                          else length)] for _ in range(n)]
generate_responses(target, prompts[:4], max_new_tokens=4, batch_size=batch)  # warm-up
batches = []
sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
sync()
start = time.perf_counter()
out = generate_responses(target, prompts, max_new_tokens=tokens, batch_size=batch,
                         on_progress=lambda done, total: batches.append(done))
sync()
seconds = time.perf_counter() - start
print(json.dumps({"seconds": seconds, "new_tokens": sum(len(r) for r in out),
                  "batches": len(batches), "distinct_lengths": len({len(p) for p in prompts}),
                  "rows": [zlib.crc32(json.dumps(r).encode()) for r in out]}))
"""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_ref_options(p)
    p.add_argument("--target", default="tiny", help="a named target shape (random weights)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--prompts", type=int, default=512)
    p.add_argument("--length", type=int, default=128, help="the usual prompt length")
    p.add_argument("--min-length", type=int, default=16)
    p.add_argument("--short", type=float, default=0.26, help="share of shorter prompts")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--tokens", type=int, default=32, help="new tokens a prompt")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default=None,
                   help="the target's weights and activations (default: float32 on the "
                        "CPU, bfloat16 elsewhere); float32 tells a real difference from "
                        "bf16 rounding")
    args = p.parse_args(argv)
    args.dtype = args.dtype or ("float32" if args.device == "cpu" else "bfloat16")
    argv_of = [args.target, args.device, str(args.prompts), str(args.length),
               str(args.min_length), str(args.short), str(args.batch), str(args.tokens),
               args.dtype]
    with trees(args) as both:
        runs = alternate(both, args.reps,
                         lambda tree, rep: probe(tree, PROBE, argv_of, "generate_batches"))
    summary: dict[str, Any] = {"ref_name": ref_name(args), **{
        k: v for k, v in vars(args).items() if k not in ("ref", "ref_tree")}}
    for name, rows in runs.items():
        seconds = statistics.median(r["seconds"] for r in rows)
        summary[name] = {"seconds": seconds, "batches": rows[0]["batches"],
                         "new_tokens_per_s": rows[0]["new_tokens"] / seconds,
                         "distinct_prompt_lengths": rows[0]["distinct_lengths"]}
    same = sum(a == b for a, b in zip(runs["tree"][0]["rows"], runs["ref"][0]["rows"],
                                      strict=True))
    summary["rows_decoded_alike"] = f"{same}/{args.prompts}"
    summary["speedup_tree_over_ref"] = summary["ref"]["seconds"] / summary["tree"]["seconds"]
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
