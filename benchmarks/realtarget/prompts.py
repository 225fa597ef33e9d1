"""The prompts stage: fixed-length code prefixes that end at a function signature."""

from __future__ import annotations

import ast
import bisect
import os
import re
import time
import warnings
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from realtarget.corpus import Doc, corpus_docs
from realtarget.heldout import load_target_model
from realtarget.pretrain import load_hf_tokenizer
from realtarget.run import PROMPT_SALT, Run, log, unit_hash, write_jsonl_atomic
from realtarget.tokenizer import pool_state, ranges, tokenizer_pool


# -- prompts ----------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Prompt:
    ids: list[int]
    text: str
    source: str
    line: int
    reference: list[int]


def signature_cuts(text: str) -> list[tuple[int, int]]:
    """(def line, char offset just after the colon that ends the signature) of every
    function whose body starts on a later line."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # invalid escapes in old code: SyntaxWarning
            tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return []
    line_starts = [0, *(m.end() for m in re.finditer("\n", text))]
    cuts = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) or not node.body:
            continue
        body_line = node.body[0].lineno
        if body_line <= node.lineno:
            continue
        sig_line = body_line - 1  # 1-based: the line before the body's first statement
        begin = line_starts[sig_line - 1]
        end = line_starts[sig_line] - 1 if sig_line < len(line_starts) else len(text)
        line = text[begin:end].rstrip()
        if line.endswith(":"):
            cuts.append((node.lineno, begin + len(line)))
    return cuts


def prompts_of_file(tok: Any, doc: Doc, *, length: int, reference: int, limit: int
                    ) -> tuple[list[Prompt], Counter[str]]:
    """Up to ``limit`` prompts: the ``length`` tokens of the file's own encoding that end
    at a signature (exactly what the model saw in training), plus the real next tokens.
    ``tok`` is a ``tokenizers.Tokenizer``."""
    skipped: Counter[str] = Counter()
    cuts = signature_cuts(doc.text)
    if not cuts:
        return [], skipped
    enc = tok.encode(doc.text, add_special_tokens=False)
    ends = [o[1] for o in enc.offsets]
    ids = enc.ids
    out: list[Prompt] = []
    for line, cut in sorted(cuts, key=lambda c: unit_hash(PROMPT_SALT + doc.rel, str(c[0]))):
        n = bisect.bisect_right(ends, cut)
        if n < length:
            skipped["short_prefix"] += 1
            continue
        prompt = ids[n - length:n]
        text = tok.decode(prompt, skip_special_tokens=False)
        if not doc.text[:cut].endswith(text):  # a token that straddles the cut, or a split
            skipped["not_a_token_boundary"] += 1  # multi-byte character at the start
            continue
        out.append(Prompt(prompt, text, doc.rel, line, ids[n:n + reference]))
        if len(out) == limit:
            break
    return out, skipped


def _prompts_range(task: tuple[int, int, int, int, int]
                   ) -> list[tuple[list[Prompt], Counter[str]]]:
    start, stop, length, reference, per_file = task
    tokenizer, docs = pool_state()
    return [prompts_of_file(tokenizer, doc, length=length, reference=reference,
                            limit=per_file) for doc in docs[start:stop]]


def collect_prompts(tokenizer_json: str, docs: list[Doc], n: int, *, length: int,
                    reference: int, per_file: int) -> tuple[list[Prompt], dict[str, int]]:
    """The first ``n`` prompts of the files in hash order, ``per_file`` at most each."""
    order = sorted(docs, key=lambda d: unit_hash(PROMPT_SALT, d.rel))
    stats: Counter[str] = Counter()
    prompts: list[Prompt] = []
    with tokenizer_pool(tokenizer_json, order) as pool:
        width = 8 * (os.cpu_count() or 1)
        for a, b in ranges(0, len(order), 8 * width):  # a wave of files, then the count
            tasks = [(x, y, length, reference, per_file) for x, y in ranges(a, b, 8)]
            for got, skipped in (r for chunk in pool.map(_prompts_range, tasks) for r in chunk):
                if len(prompts) < n:
                    stats.update(skipped)
                    stats["files_used"] += bool(got)
                    prompts.extend(got[: n - len(prompts)])
            if len(prompts) >= n:
                break
    stats["prompts"] = len(prompts)
    return prompts, dict(stats)


def prompt_rows(tok: Any, prompts: list[Prompt]) -> Iterator[dict[str, Any]]:
    for p in prompts:
        yield {"prompt_ids": p.ids, "prompt": p.text, "source": p.source, "line": p.line,
               "reference": tok.decode(p.reference)}


@torch.no_grad()
def greedy_continuations(run: Run, model: Any, prompts: list[Prompt], new_tokens: int,
                         batch: int = 64) -> list[list[int]]:
    """The target's greedy continuation of each prompt (equal lengths: no padding)."""
    out: list[list[int]] = []
    for start in range(0, len(prompts), batch):
        ids = torch.tensor([p.ids for p in prompts[start:start + batch]], device=run.device)
        gen = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                             max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                             do_sample=False, pad_token_id=model.config.eos_token_id)
        out.extend(gen[:, ids.shape[1]:].tolist())
    return out


def _leading_match(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def ngram_replay_tau(prompts: list[Prompt], continuations: list[list[int]], max_draft: int
                     ) -> dict[str, Any]:
    """The n-gram drafter's exact tau on the target's recorded greedy decodes."""
    from dflash.ngram import ReplayVerifier, speculate

    cycles: list[int] = []
    for p, cont in zip(prompts, continuations, strict=True):
        got = speculate(ReplayVerifier([*p.ids, *cont]), p.ids, max_new_tokens=len(cont),
                        max_draft=max_draft)
        cycles.extend(got.accepted)
    return {"max_draft": max_draft, "n_max": 4, "n_min": 1, "cycles": len(cycles),
            "tau": sum(cycles) / max(1, len(cycles))}


def stage_prompts(run: Run) -> dict[str, Any]:
    size = run.size
    tok = load_hf_tokenizer(run, run.target_dir)
    docs = corpus_docs(run)
    length = run.args.prompt_tokens or size.prompt_tokens
    made: dict[str, Any] = {}
    sets: dict[str, list[Prompt]] = {}
    for name, split, n in (("eval", "heldout", run.args.eval_prompts or size.eval_prompts),
                           ("train", "train", run.args.train_prompts or size.train_prompts)):
        part = [d for d in docs if d.split == split]
        t0 = time.perf_counter()
        prompts, stats = collect_prompts(tok.backend_tokenizer.to_str(), part, n,
                                         length=length, reference=64,
                                         per_file=1 if name == "eval" else 2)
        path = run.work / f"prompts-{name}.jsonl"
        write_jsonl_atomic(path, prompt_rows(tok, prompts))
        allowed = {d.rel for d in part}
        assert all(p.source in allowed for p in prompts), f"{name} prompt from another split"
        sets[name] = prompts
        made[name] = {"file": str(path), "from_split": split, "requested": n,
                      "seconds": time.perf_counter() - t0, **stats}
        log("prompts", f"{name}: {len(prompts)} prompts of {length} tokens -> {path}")
    assert not {p.source for p in sets["eval"]} & {p.source for p in sets["train"]}
    model = load_target_model(run)
    t0 = time.perf_counter()
    conts = greedy_continuations(run, model, sets["eval"], size.sample_tokens)
    gen_s = time.perf_counter() - t0
    matches = [_leading_match(c, p.reference) for c, p in zip(conts, sets["eval"], strict=True)]
    samples = [{"source": p.source, "line": p.line, "prompt_tail": p.text[-300:],
                "greedy": tok.decode(c), "reference": tok.decode(p.reference)}
               for p, c in list(zip(sets["eval"], conts, strict=True))[:4]]
    return {"prompt_tokens": length, "format": "JSONL {prompt_ids, prompt, source, line, "
                                               "reference}; dflash.data reads prompt_ids",
            "sets": made, "greedy": {
                "new_tokens": size.sample_tokens, "seconds": gen_s,
                "mean_leading_tokens_equal_to_the_file": sum(matches) / max(1, len(matches)),
                "whole_continuation_equal": sum(m == size.sample_tokens for m in matches)},
            "ngram_on_greedy": {f"max_draft_{k}": ngram_replay_tau(sets["eval"], conts, k)
                                for k in (7, 15)},
            "samples": samples}


