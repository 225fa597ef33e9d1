"""``dflash-generate``: write DFlash training data, the target's own responses to prompts
(:mod:`dflash.decoding.generate`), as JSONL rows ``{"prompt_ids", "response_ids"}`` (plus
the decoded ``response`` text when the target has a tokenizer), atomically.

Exit codes (dflash.exitcodes): 0 written, 2 bad input, 4 runtime failure, 130 interrupted.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from dflash.cli import options
from dflash.cli.command import Command
from dflash.exitcodes import ExitCode

PROG = "dflash-generate"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Write DFlash training data: the target's own responses to prompts.")
    options.add_decoding_options(p)
    p.add_argument("--out", required=True, metavar="FILE", help="JSONL to write (atomically)")
    p.add_argument("--max-new-tokens", type=int, default=512)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=64)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return Command(PROG).run(lambda: _main(args))


def check_inputs(args: argparse.Namespace) -> None:
    """Every flag and path, before torch is imported."""
    options.check_decoding_options(args)
    options.at_least("--batch-size", args.batch_size, 1)
    options.at_least("--temperature", args.temperature, 0)
    options.output_file(args.out, "--out")


def _main(args: argparse.Namespace) -> int:
    check_inputs(args)
    from dflash.data import write_jsonl_atomic
    from dflash.decoding.generate import (
        device_and_dtype,
        generate_responses,
        prompts_for,
        stop_ids_of,
    )
    from dflash.target import load_target

    device, dtype = device_and_dtype(args.device)
    target = load_target(args.target, device=device, dtype=dtype, seed=args.seed)
    prompts = prompts_for(target, prompts_file=args.prompts, synthetic=args.synthetic,
                          length=args.prompt_length, seed=args.seed)
    tok = target.tokenizer
    responses = generate_responses(
        target, prompts, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
        seed=args.seed, stop_ids=stop_ids_of(target), batch_size=args.batch_size)
    rows: list[dict[str, Any]] = []
    for prompt, response in zip(prompts, responses, strict=True):
        row: dict[str, Any] = {"prompt_ids": list(prompt), "response_ids": response}
        if tok is not None:
            row["response"] = tok.decode(response)
        rows.append(row)
    write_jsonl_atomic(args.out, rows)
    print(f"{PROG}: wrote {len(rows)} rows to {args.out}")
    return ExitCode.OK


if __name__ == "__main__":
    sys.exit(main())
