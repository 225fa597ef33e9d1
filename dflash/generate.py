"""``dflash-generate``: regenerate responses with the target (the paper's training data).

DFlash drafters are trained on the target's *own* outputs, so a drafter learns what the
target will say, not what some dataset said. This reads prompts (any format of
``dflash.data``) or makes random ones, decodes with the target (greedy by default,
batched, with a KV cache) and writes JSONL rows ``{"prompt_ids", "response_ids"}`` (plus
the decoded ``response`` text when the target has a tokenizer), atomically.

Exit codes (dflash.exitcodes): 0 written, 2 bad input, 4 runtime failure, 130 interrupted.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import torch

from dflash.exitcodes import ExitCode


def synthetic_prompts(n: int, *, vocab_size: int, length: int, seed: int,
                      exclude: Sequence[int] = ()) -> list[list[int]]:
    """n random prompts of ``length`` ids, never using the ids in ``exclude`` (MASK)."""
    if n < 1 or length < 1:
        raise ValueError(f"need n >= 1 and length >= 1, got n={n}, length={length}")
    allowed = torch.ones(vocab_size, dtype=torch.bool)
    allowed[list(exclude)] = False
    pool = allowed.nonzero().flatten()
    gen = torch.Generator().manual_seed(seed)
    picks = torch.randint(0, len(pool), (n, length), generator=gen)
    rows: list[list[int]] = pool[picks].tolist()
    return rows


def _next_tokens(logits_BV: torch.Tensor, temperature: float, gen: torch.Generator | None
                 ) -> torch.Tensor:
    if temperature <= 0:
        return logits_BV.argmax(dim=-1)
    probs = torch.softmax(logits_BV / temperature, dim=-1)
    return torch.multinomial(probs, 1, generator=gen).squeeze(-1)


@torch.no_grad()
def _generate_group(target: Any, prompts_BP: torch.Tensor, max_new_tokens: int,
                    temperature: float, gen: torch.Generator | None,
                    stop_ids: torch.Tensor) -> list[list[int]]:
    """Decode one batch of equal-length prompts; a row stops after a stop id."""
    bsz, plen = prompts_BP.shape
    cache = target.new_cache()
    logits, _ = target.forward_cached(prompts_BP, cache, 0)
    done_B = torch.zeros(bsz, dtype=torch.bool, device=prompts_BP.device)
    out: list[torch.Tensor] = []
    for i in range(max_new_tokens):
        tok_B = _next_tokens(logits[:, -1], temperature, gen)
        out.append(tok_B)
        done_B |= torch.isin(tok_B, stop_ids)
        if i + 1 == max_new_tokens or bool(done_B.all()):
            break
        logits, _ = target.forward_cached(tok_B[:, None], cache, plen + i)
    rows = torch.stack(out, dim=1).tolist()
    stops = set(stop_ids.tolist())
    result = []
    for row in rows:
        cut = next((j + 1 for j, t in enumerate(row) if t in stops), len(row))
        result.append(row[:cut])
    return result


def generate_responses(target: Any, prompts: Sequence[Sequence[int]], *, max_new_tokens: int,
                       temperature: float = 0.0, seed: int = 0, stop_ids: Sequence[int] = (),
                       batch_size: int = 64) -> list[list[int]]:
    """The target's continuation of every prompt, in input order.

    Prompts of equal length are batched together (no padding, so batching cannot change
    a greedy result); each row stops after its first stop id or ``max_new_tokens``.
    """
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    by_length: dict[int, list[int]] = defaultdict(list)
    for i, prompt in enumerate(prompts):
        if not prompt:
            raise ValueError(f"prompt {i} is empty")
        by_length[len(prompt)].append(i)
    gen = None
    if temperature > 0:
        gen = torch.Generator(device=target.device).manual_seed(seed)
    stops = torch.tensor(list(stop_ids), dtype=torch.long, device=target.device)
    responses: list[list[int]] = [[] for _ in prompts]
    for length in sorted(by_length):
        index = by_length[length]
        for start in range(0, len(index), batch_size):
            chunk = index[start:start + batch_size]
            ids = torch.tensor([list(prompts[i]) for i in chunk], dtype=torch.long,
                               device=target.device)
            for i, row in zip(chunk, _generate_group(target, ids, max_new_tokens,
                                                     temperature, gen, stops), strict=True):
                responses[i] = row
    return responses


def device_and_dtype(name: str) -> tuple[str, torch.dtype]:
    """``auto`` picks cuda when present; bf16 on GPU, fp32 on CPU."""
    device = ("cuda" if torch.cuda.is_available() else "cpu") if name == "auto" else name
    return device, torch.bfloat16 if device.startswith("cuda") else torch.float32


def prompts_for(target: Any, *, prompts_file: str | None, synthetic: int | None,
                length: int, seed: int) -> list[list[int]]:
    """Prompts from a JSONL file (any dflash.data format) or ``synthetic`` random ones."""
    from dflash.data import read_prompts

    if prompts_file:
        return read_prompts(prompts_file, tokenizer=target.tokenizer)
    return synthetic_prompts(synthetic or 0, vocab_size=target.vocab_size, length=length,
                             seed=seed, exclude=(target.mask_token_id,))


def stop_ids_of(target: Any) -> tuple[int, ...]:
    eos = getattr(target.tokenizer, "eos_token_id", None) if target.tokenizer else None
    return () if eos is None else (int(eos),)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="dflash-generate",
        description="Write DFlash training data: the target's own responses to prompts.")
    p.add_argument("--target", required=True,
                   help="local HF model folder/config, or a named shape (tiny, ...)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompts", metavar="FILE", help="JSONL prompts (any dflash.data format)")
    src.add_argument("--synthetic", type=int, metavar="N", help="N random-token prompts")
    p.add_argument("--prompt-length", type=int, default=16, help="for --synthetic")
    p.add_argument("--out", required=True, metavar="FILE", help="JSONL to write (atomically)")
    p.add_argument("--max-new-tokens", type=int, default=512)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from dflash.data import DataError, write_jsonl_atomic
    from dflash.target import TargetError, load_target
    from envguard.errors import OutputError

    device, dtype = device_and_dtype(args.device)
    try:
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
    except (DataError, TargetError, OutputError, ValueError, OSError) as exc:
        print(f"dflash-generate: {exc}", file=sys.stderr)
        return ExitCode.BAD_INPUT
    except RuntimeError as exc:
        print(f"dflash-generate: failed: {str(exc).splitlines()[0]}", file=sys.stderr)
        return ExitCode.FAILED
    except KeyboardInterrupt:
        print("dflash-generate: interrupted", file=sys.stderr)
        return ExitCode.INTERRUPTED
    print(f"dflash-generate: wrote {len(rows)} rows to {args.out}")
    return ExitCode.OK


if __name__ == "__main__":
    sys.exit(main())
