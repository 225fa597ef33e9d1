"""``dflash-eval``: real speculative decoding with a trained drafter against its target.

Reports tau (mean tokens per target forward), the wall-clock speedup over target-only
greedy decoding, and whether the speculative output equals the target's own greedy
output token for token (it must: anything else is a bug).

Exit codes (dflash.exitcodes): 0 lossless, 1 an output differed, 2 bad input (drafter,
target, prompts, or a drafter trained for another target), 4 runtime failure, 130
interrupted.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from dflash.exitcodes import ExitCode


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="dflash-eval",
        description="Speculative decoding with a DFlash drafter: tau, speedup, losslessness.")
    p.add_argument("--drafter", required=True, metavar="DIR",
                   help="exported drafter folder (config.json + model.safetensors)")
    p.add_argument("--target", required=True,
                   help="local HF model folder/config, or a named shape (tiny, ...)")
    p.add_argument("--target-seed", type=int, default=0,
                   help="weights seed of a random (named-shape or config-only) target; "
                        "use the training run's seed")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompts", metavar="FILE", help="JSONL prompts (any dflash.data format)")
    src.add_argument("--synthetic", type=int, metavar="N", help="N random-token prompts")
    p.add_argument("--prompt-length", type=int, default=16, help="for --synthetic")
    p.add_argument("--seed", type=int, default=1234, help="for --synthetic")
    p.add_argument("--limit", type=int, help="evaluate at most this many prompts")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    return p


def check_pair(drafter_cfg: Any, target: Any) -> None:
    """Refuse a drafter trained for another target (it would decode, at tau ~ 1)."""
    problems = []
    for name, mine, theirs in (
            ("hidden_size", drafter_cfg.hidden_size, target.hidden_size),
            ("vocab_size", drafter_cfg.vocab_size, target.vocab_size),
            ("num_target_layers", drafter_cfg.num_target_layers, target.num_layers)):
        if mine != theirs:
            problems.append(f"{name} {mine} != target's {theirs}")
    if problems:
        raise ValueError("the drafter was trained for another target: " + "; ".join(problems))


def render_text(report: Any) -> str:
    hist = ", ".join(f"{i + 1}:{n}" for i, n in enumerate(report.acceptance_histogram) if n)
    lines = [
        f"prompts {report.prompts}, tokens {report.tokens}",
        f"tau {report.tau:.2f} tokens per target forward (per cycle: {hist})",
        f"target-only {report.target_seconds:.2f} s, speculative "
        f"{report.speculative_seconds:.2f} s, speedup {report.speedup:.2f}x",
        "lossless: output equals target-only greedy, token for token" if report.lossless
        else f"NOT LOSSLESS: {len(report.mismatches)} prompt(s) differ, first at prompt "
             f"{report.mismatches[0].prompt}, token {report.mismatches[0].position}",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from dflash.checkpoint import CheckpointError, load_drafter
    from dflash.data import DataError
    from dflash.generate import device_and_dtype, prompts_for, stop_ids_of
    from dflash.speculative import evaluate
    from dflash.target import TargetError, load_target

    device, dtype = device_and_dtype(args.device)
    try:
        drafter = load_drafter(args.drafter, device=device, dtype=dtype).eval()
        target = load_target(args.target, device=device, dtype=dtype,
                             layer_ids=drafter.cfg.target_layer_ids,
                             mask_token_id=drafter.cfg.mask_token_id, seed=args.target_seed)
        check_pair(drafter.cfg, target)
        prompts = prompts_for(target, prompts_file=args.prompts, synthetic=args.synthetic,
                              length=args.prompt_length, seed=args.seed)
        prompts = prompts[: args.limit] if args.limit else prompts
        report = evaluate(target, drafter, prompts, max_new_tokens=args.max_new_tokens,
                          stop_ids=stop_ids_of(target))
    except (CheckpointError, DataError, TargetError, ValueError, OSError) as exc:
        print(f"dflash-eval: {exc}", file=sys.stderr)
        return ExitCode.BAD_INPUT
    except RuntimeError as exc:
        print(f"dflash-eval: failed: {str(exc).splitlines()[0]}", file=sys.stderr)
        return ExitCode.FAILED
    except KeyboardInterrupt:
        print("dflash-eval: interrupted", file=sys.stderr)
        return ExitCode.INTERRUPTED
    print(json.dumps(report.to_dict(), indent=2) if args.json else render_text(report))
    return ExitCode.OK if report.lossless else ExitCode.MISMATCH


if __name__ == "__main__":
    sys.exit(main())
