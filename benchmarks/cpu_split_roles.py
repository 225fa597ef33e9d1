"""Colocated vs split roles under torchrun on CPU (gloo), at equal world size.

    .venv/bin/python benchmarks/cpu_split_roles.py --world 2 --steps 30

Also one process alone (no torch.distributed), for the per-step cost without
communication. Colocated: every rank holds the target and trains. Split (``--target-ranks 1``): the
last rank runs the target and streams features; the others train. Reports the median
context tokens/s over the steps after the first ``--skip``, each layout in fresh
processes, and the FLOP split of one step (target forward vs the rest) from dflash's
FLOP model, which is what decides the comparison on paper.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def run_layout(world: int, target_ranks: int, steps: int, skip: int, preset: str,
               extra: list[str]) -> dict[str, float]:
    out = Path(tempfile.mkdtemp(prefix="dflash-split-")) / "run"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
           str(world), "-m", "dflash.cli.train", "--preset", preset, "--unguarded", "--quiet",
           "--out", str(out), f"--steps={steps}", "--set=log_every=1", "--set=save_every=0",
           "--set=eval_every=0", *extra]
    if target_ranks:
        cmd += ["--target-ranks", str(target_ranks)]
    env = {k: v for k, v in os.environ.items() if k != "ENVGUARD_VERIFIED"}
    env["OMP_NUM_THREADS"] = "1"
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{cmd}: exit {proc.returncode}\n{proc.stderr[-2000:]}")
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    tail = records[skip:]
    return {"world": world, "target_ranks": target_ranks, "wall_s": wall,
            "step_ms": 1000 * statistics.median(r["step_s"] for r in tail),
            "ctx_tok_s": statistics.median(r["ctx_tok_s"] for r in tail),
            "loss_last": records[-1]["loss"]}


def flop_split(preset: str) -> dict[str, float]:
    """Per step, from the FLOP model: the target's forward and everything else."""
    import dataclasses

    import torch

    from dflash.flops import count_params, flop_model
    from dflash.model import DFlashDrafter
    from dflash.presets import PRESETS
    from dflash.target import drafter_config_for, load_target

    cfg = PRESETS[preset]()
    target = load_target(cfg.target, device="meta", dtype=torch.bfloat16)
    dcfg = drafter_config_for(target, num_layers=cfg.draft_layers, block_size=cfg.block_size,
                              gamma=cfg.gamma, mask_token_id=cfg.mask_token_id)
    used = count_params(target.layers[: max(dcfg.target_layer_ids) + 1])
    layer = count_params(DFlashDrafter(dataclasses.replace(dcfg, num_layers=1)).layers[0])
    model = flop_model(dcfg, used, layer)
    ctx = cfg.batch_size * max(cfg.buckets)
    draft = cfg.batch_size * cfg.anchors * cfg.block_size
    total = model.step_flops(ctx, draft, draft * max(cfg.buckets) / 2)
    target_flops = 2.0 * used * ctx
    feature_bytes = ctx * dcfg.num_features * dcfg.hidden_size * 2
    return {"target_forward_share": target_flops / total, "step_gflop": total / 1e9,
            "feature_mb_per_step_bf16": feature_bytes / 1e6}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--skip", type=int, default=5)
    p.add_argument("--preset", default="tiny")
    p.add_argument("--set", dest="extra", action="append", default=[],
                   help="recipe override passed to dflash-train (repeatable)")
    args = p.parse_args()
    extra = [f"--set={kv}" for kv in args.extra]
    single = run_layout(1, 0, args.steps, args.skip, args.preset, extra)
    colocated = run_layout(args.world, 0, args.steps, args.skip, args.preset, extra)
    split = run_layout(args.world, 1, args.steps, args.skip, args.preset, extra)
    result = {"single_process": single, "colocated": colocated, "split": split,
              "split_over_colocated_ctx_tok_s": split["ctx_tok_s"] / colocated["ctx_tok_s"],
              "paper": {name: flop_split(name) for name in
                        (args.preset, "qwen3-1.7b-shape", "qwen3-8b-shape")}}
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
