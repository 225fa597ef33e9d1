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
from pathlib import Path
from typing import TYPE_CHECKING

from dflash.checkpoint.layout import WEIGHTS_NAME, read_config
from dflash.cli import options
from dflash.cli.command import Command
from dflash.config import DrafterConfig
from dflash.errors import CheckpointError, ConfigError
from dflash.exitcodes import ExitCode

if TYPE_CHECKING:
    from dflash.decoding.speculative import EvalReport
    from dflash.target import TargetModel

PROG = "dflash-eval"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Speculative decoding with a DFlash drafter: tau, speedup, losslessness.")
    p.add_argument("--drafter", required=True, metavar="DIR",
                   help="exported drafter folder (config.json + model.safetensors)")
    options.add_decoding_options(p)
    p.add_argument("--target-seed", type=int, default=0,
                   help="weights seed of a random (named-shape or config-only) target; "
                        "use the training run's seed")
    p.add_argument("--seed", type=int, default=1234, help="for --synthetic")
    p.add_argument("--limit", type=int, help="evaluate at most this many prompts")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return Command(PROG).run(lambda: _main(args))


def check_inputs(args: argparse.Namespace) -> DrafterConfig:
    """Every flag and path, before torch is imported; the drafter's config."""
    drafter_cfg = read_config(Path(args.drafter))
    options.readable_file(Path(args.drafter) / WEIGHTS_NAME, CheckpointError)
    options.check_decoding_options(args)
    options.at_least("--limit", args.limit, 0)
    return drafter_cfg


def check_pair(drafter_cfg: DrafterConfig, target: TargetModel) -> None:
    """Refuse a drafter trained for another target (it would decode, at tau ~ 1)."""
    problems = []
    for name, mine, theirs in (
            ("hidden_size", drafter_cfg.hidden_size, target.hidden_size),
            ("vocab_size", drafter_cfg.vocab_size, target.vocab_size),
            ("num_target_layers", drafter_cfg.num_target_layers, target.num_layers)):
        if mine != theirs:
            problems.append(f"{name} {mine} != target's {theirs}")
    if problems:
        raise ConfigError("the drafter was trained for another target: " + "; ".join(problems))


def _main(args: argparse.Namespace) -> int:
    check_inputs(args)
    from dflash.checkpoint.export import load_drafter
    from dflash.decoding.generate import device_and_dtype, prompts_for, stop_ids_of
    from dflash.decoding.speculative import evaluate
    from dflash.target import load_target

    device, dtype = device_and_dtype(args.device)
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
    print(json.dumps(report.to_dict(), indent=2) if args.json else render_text(report))
    return ExitCode.OK if report.lossless else ExitCode.MISMATCH


def render_text(report: EvalReport) -> str:
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


if __name__ == "__main__":
    sys.exit(main())
