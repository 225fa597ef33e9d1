"""The command line of ``benchmarks/real_target.py`` and the pipeline's stage order."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from realtarget.corpus import stage_corpus
from realtarget.drafter import DRAFT_CAP, stage_eval, stage_generate, stage_probe, stage_train
from realtarget.heldout import stage_heldout
from realtarget.pretrain import stage_pretrain
from realtarget.prompts import stage_prompts
from realtarget.run import SIZES, Run, Stage, log
from realtarget.tokenizer import stage_tokenizer

STAGES: list[Stage] = [
    Stage("corpus", stage_corpus),
    Stage("tokenizer", stage_tokenizer),
    Stage("pretrain", stage_pretrain),
    Stage("heldout", stage_heldout),
    Stage("prompts", stage_prompts),
    Stage("generate", stage_generate),
    Stage("probe", stage_probe),
    Stage("train", stage_train),
    Stage("eval", stage_eval),
]




# -- command line -----------------------------------------------------------------------------
def build_parser(description: str = "") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, type=Path, help="stage results (<stage>.json)")
    p.add_argument("--work", type=Path, help="bulky artifacts (tokens, target, prompts); "
                                             "default: --out")
    p.add_argument("--minutes", type=float, default=3.0, help="pretraining wall-clock")
    p.add_argument("--deadline-s", type=float, metavar="S",
                   help="shorten pretraining so that the whole run can end S seconds after "
                        "the start (for a machine lent for a fixed time)")
    p.add_argument("--reserve-s", type=float, default=60.0,
                   help="with --deadline-s: seconds kept for saving and the later stages")
    p.add_argument("--size", choices=sorted(SIZES), default="small")
    p.add_argument("--stages", default=",".join(s.name for s in STAGES),
                   help="comma-separated, from: " + ", ".join(s.name for s in STAGES))
    p.add_argument("--seed", type=int, default=0, help="weights and data order (the split "
                                                       "and the file choice do not depend on it)")
    p.add_argument("--corpus-root", action="append", metavar="DIR",
                   help="a folder of .py files (repeatable); default: stdlib + site-packages")
    p.add_argument("--max-corpus-mb", type=float, help="default: the size's")
    p.add_argument("--heldout-fraction", type=float, default=0.03)
    p.add_argument("--max-file-kb", type=int, default=1024)
    p.add_argument("--max-line", type=int, default=1000,
                   help="leave out files with a longer line (generated code)")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    p.add_argument("--compile", choices=["off", "on"], default="on",
                   help="torch.compile the model for pretraining (compile time counts; "
                        "451k against 265k tokens/s eager on the H200)")
    p.add_argument("--peak-tflops", type=float, help="MFU denominator (default: datasheet "
                                                     "dense bf16 of an H100/H200)")
    p.add_argument("--prompt-tokens", type=int, help="default: the size's")
    p.add_argument("--train-prompts", type=int, help="default: the size's")
    p.add_argument("--eval-prompts", type=int, help="default: the size's")
    g = p.add_argument_group("the drafter experiment (generate, probe, train, eval)")
    g.add_argument("--gen-prompts", type=int, help="training prompts to answer (default all)")
    g.add_argument("--gen-new-tokens", type=int,
                   help="default 320, or half the positions a prompt leaves (tiny: 48)")
    g.add_argument("--gen-batch", type=int, default=512)
    g.add_argument("--replay-sample", type=int, default=256,
                   help="responses the n-gram replay tau of the generate stage uses")
    g.add_argument("--drafter-layers", type=int, default=5)
    g.add_argument("--drafter-batch", type=int, default=32, help="sequences a step")
    g.add_argument("--drafter-anchors", type=int, default=64, help="blocks a sequence")
    g.add_argument("--drafter-seconds", type=float, default=240.0,
                   help="training budget: steps = this / the probe's step time")
    g.add_argument("--probe-steps", type=int, default=30)
    g.add_argument("--train-startup-s", type=float, default=45.0,
                   help="allowed for dflash-train's start before SIGTERM")
    g.add_argument("--train-finish-s", type=float, default=120.0,
                   help="allowed after the drafter's budget for its last held-out "
                        "evaluation and export, before SIGTERM")
    g.add_argument("--held-out-cycle", choices=["eager", "static", "auto"], default="auto",
                   help="the trainer's held-out decode (held_out_decode_cycle): static "
                        "captures it in CUDA graphs; auto, dflash-train's default, is static "
                        "on dflash's own Qwen3 on a GPU")
    g.add_argument("--train-reserve-s", type=float, default=120.0,
                   help="with --deadline-s: seconds kept for start-up, the drafter's last "
                        "held-out evaluation and the eval stage")
    g.add_argument("--eval-drafters", default="ngram,trained,untrained:8,checkpoints:8",
                   help="comma-separated: ngram, untrained, trained, hybrid (prompt lookup "
                        "where the context repeats, else the trained drafter), hybrid-useful "
                        "(--lookup-branch useful), checkpoints; NAME:N evaluates that one on N "
                        "prompts (default --eval-limit, --checkpoint-prompts for checkpoints); "
                        "a name given again runs again, as NAME#2")
    g.add_argument("--eval-cycles", default="auto",
                   help="comma-separated dflash-eval --cycle paths (auto, eager, static): "
                        "each drafter is evaluated on each, named DRAFTER/PATH")
    g.add_argument("--eval-limit", type=int, default=24, help="eval prompts per drafter")
    g.add_argument("--checkpoint-prompts", type=int, default=8,
                   help="eval prompts for each intermediate checkpoint")
    g.add_argument("--eval-new-tokens", type=int,
                   help="default 192, or half the positions a prompt and a last verify "
                        "leave (tiny: 40)")
    g.add_argument("--eval-dtype", choices=["auto", "bfloat16", "float32"],
                   default="float32", help="float32: the lossless check compares argmaxes "
                                           "that bf16 rounding can flip at near-ties")
    return p


def main(argv: list[str] | None = None, *, description: str = "") -> int:
    args = build_parser(description).parse_args(argv)
    names = [s.strip() for s in args.stages.split(",") if s.strip()]
    known = {s.name: s for s in STAGES}
    if unknown := [n for n in names if n not in known]:
        raise SystemExit(f"real_target: unknown stage(s) {unknown}; known: {list(known)}")
    device = torch.device(("cuda" if torch.cuda.is_available() else "cpu")
                          if args.device == "auto" else args.device)
    size = SIZES[args.size]
    prompt = args.prompt_tokens or size.prompt_tokens
    # A prompt, its answer (or its decode and a last verify) within the target's positions:
    # dflash-generate, -train and -eval refuse what would pass them.
    room = size.seq_len - prompt
    args.gen_new_tokens = args.gen_new_tokens or min(320, room // 2)
    args.eval_new_tokens = args.eval_new_tokens or min(192, (room - DRAFT_CAP) // 2)
    if prompt + args.gen_new_tokens > size.seq_len or \
            prompt + args.eval_new_tokens + DRAFT_CAP > size.seq_len:
        raise SystemExit(f"real_target: {prompt} prompt tokens and --gen-new-tokens "
                         f"{args.gen_new_tokens} or --eval-new-tokens {args.eval_new_tokens} "
                         f"(and {DRAFT_CAP} drafts) pass the {args.size} target's "
                         f"{size.seq_len} positions")
    run = Run(args, size, args.out, args.work or args.out, device)
    run.out.mkdir(parents=True, exist_ok=True)
    run.work.mkdir(parents=True, exist_ok=True)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    log("real_target", f"size {args.size}, device {device}, stages {names}, out {run.out}, "
                       f"work {run.work}")
    for stage in STAGES:  # the pipeline's order, whatever the order given
        if stage.name not in names:
            continue
        t0 = time.perf_counter()
        result = stage.run(run)
        result["wall_s"] = time.perf_counter() - t0
        run.save_result(stage.name, result)
        log(stage.name, f"done in {result['wall_s']:.1f} s: "
                        f"{json.dumps(result, default=str)[:600]}")
    return 0

