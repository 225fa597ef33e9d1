"""``dflash-generate``: write DFlash training data, the target's own responses to prompts
(:mod:`dflash.decoding.generate`), as JSONL rows ``{"prompt_ids", "response_ids"}`` (plus
the decoded ``response`` text when the target has a tokenizer, and the prompt row's
``source`` or ``prompt_id``, by which the trainer holds out whole sources), atomically.
Progress (each phase, then the prompts done) goes to stderr.

Exit codes (dflash.exitcodes): 0 written, 2 bad input, 4 runtime failure, 130 interrupted.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from dflash.cli import options
from dflash.cli.command import Command
from dflash.cli.command import entry as command_entry
from dflash.exitcodes import ExitCode
from envguard.render.sanitize import escape_controls

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
    p.add_argument("--dtype", choices=("auto", "bfloat16", "float32"), default="auto",
                   help="target dtype (auto: bfloat16 on GPU, float32 on CPU)")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
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
    from dflash.cli.progress import Progress

    progress = Progress(PROG, quiet=args.quiet)
    progress.phase("importing torch")
    from dflash.data import read_origins, write_jsonl_atomic
    from dflash.decoding.generate import (
        check_context,
        device_and_dtype,
        generate_responses,
        prompts_for,
        stop_ids_of,
    )
    from dflash.target import load_target

    device, dtype = device_and_dtype(args.device, args.dtype)
    with progress:
        progress.phase(f"loading the target {args.target}")
        target = load_target(args.target, device=device, dtype=dtype, seed=args.seed)
        progress.phase("reading the prompts")
        prompts = prompts_for(target, prompts_file=args.prompts, synthetic=args.synthetic,
                              length=args.prompt_length, seed=args.seed)
        check_context(target, prompts, args.max_new_tokens)
        origins = read_origins(args.prompts) if args.prompts else [{}] * len(prompts)
        tok = target.tokenizer
        progress.phase(f"generating up to {args.max_new_tokens} tokens for {len(prompts)} "
                       f"prompt(s), {args.batch_size} at a time")
        progress.start("prompt", len(prompts))
        responses = generate_responses(
            target, prompts, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
            seed=args.seed, stop_ids=stop_ids_of(target), batch_size=args.batch_size,
            on_progress=progress.update)
        progress.close()
        progress.phase(f"writing {args.out}")
        rows: list[dict[str, Any]] = []
        for prompt, response, origin in zip(prompts, responses, origins, strict=True):
            row: dict[str, Any] = {**origin, "prompt_ids": list(prompt),
                                   "response_ids": response}
            if tok is not None:
                row["response"] = tok.decode(response)
            rows.append(row)
        write_jsonl_atomic(args.out, rows)
    print(f"{PROG}: wrote {len(rows)} rows to {escape_controls(str(args.out))}")
    return ExitCode.OK


def entry() -> int:
    """The console script and ``python -m``: :func:`main`, with compiled modules kept
    (:func:`dflash.cli.command.entry`)."""
    return command_entry(main)


if __name__ == "__main__":
    sys.exit(entry())
