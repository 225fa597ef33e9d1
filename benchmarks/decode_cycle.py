"""What one speculative-decoding cycle costs at batch 1, this tree against a git ref (A/B).

    python benchmarks/decode_cycle.py --ref HEAD~1 --reps 9                      # CPU
    python3 benchmarks/decode_cycle.py --ref HEAD~1 --device cuda \
        --target qwen3-1.7b-shape --reps 5                                       # GPU

At batch 1 a small target and the drafter are bound by kernel launches and Python, not
by arithmetic, so the number of operators a step dispatches is what decides its time.
Each rep runs, for each tree in turn (alternating, so a slow minute of the machine hits
both), a fresh process that builds the target (random weights) and an untrained DFlash
drafter for it (5 layers, block 16), and measures:

target_ms   a target-only greedy token (``target_greedy``: one cached forward a token);
cycle_ms    a DFlash cycle (``speculative_greedy``: the drafter's block, the 16-token
            verify forward, the bookkeeping). Untrained, every cycle accepts one token,
            so every cycle has the same shapes;
ops         top-level aten operators of a target forward of 1 and of 16 tokens and of one
            drafter block (``torch.profiler``, once, in the first rep).

The ref is checked out with ``git worktree`` into a temporary folder and removed after;
``--ref-tree DIR`` names a checkout made beforehand instead (benchmarks/abtree.py).
Prints one JSON document: per tree the medians, and tree / ref ratios.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from typing import Any

from abtree import add_ref_options, alternate, probe, ref_name, trees

PROBE = r"""
import collections, json, sys, time, torch
from dflash.decoding.speculative import DraftStream, speculative_greedy, target_greedy
from dflash.startup import build_drafter
from dflash.target import drafter_config_for, load_target

name, device, tokens, want_ops = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1"
dtype = torch.float32 if device == "cpu" else torch.bfloat16
if device == "cpu":
    torch.set_num_threads(1)
target = load_target(name, device=device, dtype=dtype)
cfg = drafter_config_for(target, num_layers=5, block_size=16, gamma=7.0)
drafter = build_drafter(cfg, target.device).to(dtype).eval()
prompt = [(7 * i + 3) % (target.vocab_size - 1) for i in range(64)]
target_greedy(target, prompt, max_new_tokens=8)                    # warm-up
speculative_greedy(target, drafter, prompt, max_new_tokens=8)
ref = target_greedy(target, prompt, max_new_tokens=tokens)
spec = speculative_greedy(target, drafter, prompt, max_new_tokens=tokens)
out = {"target_ms": ref.seconds / max(1, ref.target_forwards) * 1e3,
       "cycle_ms": spec.seconds / max(1, len(spec.accepted)) * 1e3,
       "equal": ref.tokens == spec.tokens}
if want_ops:
    from torch.profiler import ProfilerActivity, profile

    def count(fn):
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            fn()
        return sum(1 for e in prof.events() if e.name.startswith("aten::")
                   and (e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::")))

    with torch.no_grad():
        cache = target.new_cache()
        _, feats = target.forward_cached(torch.tensor([prompt], device=target.device), cache, 0)
        p = len(prompt)

        def forward(t):
            def run():
                ids = torch.arange(1, t + 1, device=target.device)[None]
                target.forward_cached(ids, cache, p)
                target.crop_cache(cache, p)
            return run

        stream = DraftStream(drafter, target)
        stream.draft(prompt[-1], p, feats)

        def block():
            stream.cache.crop(p - 1)
            stream.draft(prompt[-1], p, feats[:, -1:])

        out["ops"] = {"target_1": count(forward(1)), "target_16": count(forward(16)),
                      "drafter_block": count(block)}
print(json.dumps(out))
"""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_ref_options(p)
    p.add_argument("--target", default="tiny", help="a named target shape (random weights)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--tokens", type=int, default=96, help="tokens decoded a rep")
    p.add_argument("--reps", type=int, default=7)
    args = p.parse_args(argv)
    argv_of = [args.target, args.device, str(args.tokens)]
    with trees(args) as both:
        runs = alternate(both, args.reps, lambda tree, rep: probe(
            tree, PROBE, [*argv_of, "1" if rep == 0 else "0"], "decode_cycle"))
    summary: dict[str, Any] = {"ref_name": ref_name(args), "target": args.target,
                               "device": args.device, "tokens": args.tokens, "reps": args.reps}
    for name, rows in runs.items():
        summary[name] = {key: statistics.median(r[key] for r in rows)
                         for key in ("target_ms", "cycle_ms")}
        summary[name]["cycle_in_target_forwards"] = (summary[name]["cycle_ms"]
                                                      / summary[name]["target_ms"])
        summary[name]["ops"] = rows[0].get("ops")
        summary[name]["lossless_every_rep"] = all(r["equal"] for r in rows)
    summary["ratio_tree_over_ref"] = {
        key: summary["tree"][key] / summary["ref"][key] for key in ("target_ms", "cycle_ms")}
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
