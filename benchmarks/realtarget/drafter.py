"""The drafter experiment: generate, probe, train and eval, through the project's own commands."""

from __future__ import annotations

import json
import math
import shutil
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from realtarget.pretrain import load_hf_tokenizer, peak_tflops
from realtarget.run import Run, log, run_cli

# -- the drafter experiment: generate, probe, train, eval ---------------------------------
DRAFT_CAP = 15
"""Drafts verified per cycle, the same for every drafter: DFlash's block 16 minus one."""


def py_module(module: str) -> list[str]:
    return [sys.executable, "-m", module]


def device_flag(run: Run) -> list[str]:
    return ["--device", str(run.device)]


def _subset_jsonl(src: Path, dst: Path, n: int | None) -> int:
    """The first ``n`` rows of ``src`` (all with None) into ``dst``; their count."""
    rows = src.read_text(encoding="utf-8").splitlines()
    rows = rows[:n] if n else rows
    dst.write_text("".join(r + "\n" for r in rows), encoding="utf-8")
    return len(rows)


def distinct_ngram_ratio(seqs: Iterable[Sequence[int]], n: int = 4) -> float:
    """Distinct n-grams / n-grams within each sequence, averaged: 1 = no repetition."""
    ratios = []
    for seq in seqs:
        grams = [tuple(seq[i:i + n]) for i in range(len(seq) - n + 1)]
        if grams:
            ratios.append(len(set(grams)) / len(grams))
    return sum(ratios) / max(1, len(ratios))


def stage_generate(run: Run) -> dict[str, Any]:
    args = run.args
    prompts = run.work / "prompts-gen.jsonl"
    n = _subset_jsonl(run.work / "prompts-train.jsonl", prompts, args.gen_prompts)
    data = run.work / "train-data.jsonl"
    argv = [*py_module("dflash.cli.generate"), "--target", str(run.target_dir), "--prompts",
            str(prompts), "--out", str(data), "--max-new-tokens", str(args.gen_new_tokens),
            "--batch-size", str(args.gen_batch), *device_flag(run)]
    res = run_cli(run, "generate", argv, echo=True)
    if res["rc"] != 0:
        raise SystemExit(f"real_target: dflash-generate failed (rc {res['rc']}): "
                         f"{res['tail'][-800:]}")
    rows = [json.loads(line) for line in data.read_text(encoding="utf-8").splitlines()]
    lengths = [len(r["response_ids"]) for r in rows]
    tok = load_hf_tokenizer(run, run.target_dir)
    eos = tok.eos_token_id
    sample = rows[: args.replay_sample]
    from dflash.ngram import ReplayVerifier, speculate

    cycles: list[int] = []
    for r in sample:  # the n-gram drafter's exact tau on the training responses
        got = speculate(ReplayVerifier([*r["prompt_ids"], *r["response_ids"]]),
                        r["prompt_ids"], max_new_tokens=len(r["response_ids"]),
                        max_draft=DRAFT_CAP)
        cycles.extend(got.accepted)
    return {"command": argv, "rc": res["rc"], "seconds": res["seconds"], "prompts": n,
            "file": str(data), "new_tokens_asked": args.gen_new_tokens,
            "response_tokens": sum(lengths), "mean_response_tokens": sum(lengths) / len(rows),
            "ended_at_eos": sum(1 for r in rows if r["response_ids"][-1:] == [eos]),
            "tokens_per_s": sum(lengths) / max(res["seconds"], 1e-9),
            "distinct_4gram_ratio": distinct_ngram_ratio(r["response_ids"] for r in rows),
            "ngram_replay": {"rows": len(sample), "max_draft": DRAFT_CAP, "cycles": len(cycles),
                             "tau": sum(cycles) / max(1, len(cycles))},
            "samples": [r.get("response", "")[:400] for r in rows[:3]]}


def train_argv(run: Run, steps: int, out: Path, *, probe: bool = False,
               seconds: float = 0.0) -> list[str]:
    """dflash-train with the paper's recipe (the qwen3-8b-shape preset: lr 6e-4, 4 %
    warm-up, cosine to 0, AdamW betas 0.9/0.999, clip 1, B=16, gamma 7) on this target,
    sized for it: ``--drafter-layers`` layers, batches of ``--drafter-batch`` sequences of
    prompt + response, ``--drafter-anchors`` blocks per sequence. ``seconds``: the loop's
    time budget (``max_seconds``), after which the run evaluates and exports its last step."""
    args = run.args
    length = (args.prompt_tokens or run.size.prompt_tokens) + args.gen_new_tokens
    log_every = 10 if probe else max(1, steps // 24)
    with open(run.work / "train-data.jsonl", "rb") as data:
        rows = sum(1 for _ in data)  # a tiny run's few rows: an eighth held out, not 2 batches
    sets = {"draft_layers": args.drafter_layers, "block_size": 16, "gamma": 7.0,
            "batch_size": args.drafter_batch, "buckets": length,
            "anchors": args.drafter_anchors,
            "held_out": min(2 * args.drafter_batch, max(1, rows // 8)),
            "log_every": log_every, "eval_every": 0 if probe else max(1, steps // 4),
            # the held-out τ measured as dflash-eval measures decoding: as many prompts,
            # as many new tokens (the walk's window follows held_out_decode_tokens)
            "held_out_decode_prompts": args.eval_limit,
            "held_out_decode_tokens": args.eval_new_tokens,
            "held_out_decode_cycle": args.held_out_cycle,
            "save_every": 0 if probe else max(1, steps // 3), "keep_checkpoints": 10,
            "compile": "off", "mega_cache": "off", "seed": args.seed,
            "peak_tflops": peak_tflops(run) or 0, "max_seconds": seconds}
    if not sets["peak_tflops"]:
        del sets["peak_tflops"]
    argv = [*py_module("dflash.cli.train"), "--preset", "qwen3-8b-shape", "--target",
            str(run.target_dir), "--data", str(run.work / "train-data.jsonl"), "--steps",
            str(steps), "--out", str(out), "--attention", "sdpa", "--unguarded"]
    for key, value in sets.items():
        argv += ["--set", f"{key}={value}"]
    return argv


def read_metrics(folder: Path) -> list[dict[str, Any]]:
    path = folder / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()
            if line.strip()]


def stage_probe(run: Run) -> dict[str, Any]:
    out = run.work / "probe"
    argv = train_argv(run, run.args.probe_steps, out, probe=True)
    res = run_cli(run, "probe", argv, echo=True)
    records = read_metrics(out)
    if res["rc"] != 0 or not records:
        raise SystemExit(f"real_target: the dflash-train probe failed (rc {res['rc']}): "
                         f"{res['tail'][-1500:]}")
    return {"command": argv, "rc": res["rc"], "seconds": res["seconds"],
            "steps": run.args.probe_steps, "step_s": records[-1]["step_s"],
            "records": records, "export": str(out / "drafter")}


def _step_s(run: Run) -> float:
    """Seconds a step, from the probe (the last logged interval: warm by then)."""
    return float(run.result("probe")["step_s"])


def stage_train(run: Run) -> dict[str, Any]:
    args = run.args
    if not run.has_result("probe"):
        run.save_result("probe", stage_probe(run))
    step_s = _step_s(run)
    budget = args.drafter_seconds
    left = run.seconds_left() - args.train_reserve_s
    if left < budget:
        log("train", f"--deadline-s leaves {left:.0f} s of the {budget:.0f} s asked")
        budget = max(10.0, left)
    steps = max(3, int(budget / step_s))
    out = run.work / "drafter-run"
    # A fresh drafter: dflash-train appends to a folder's metrics.jsonl and keeps its
    # checkpoints and export, so an earlier train stage's would be read as this one's.
    shutil.rmtree(out, ignore_errors=True)
    argv = train_argv(run, steps, out, seconds=budget)
    # The run ends itself when the budget is spent (its last step evaluated and exported,
    # so the held-out τ describes the weights the eval decodes with). Start-up before the
    # first step and that last evaluation are allowed for; past them, SIGTERM stops it.
    res = run_cli(run, "train", argv, echo=True,
                  timeout=budget + args.train_startup_s + args.train_finish_s)
    records = read_metrics(out)
    checkpoints = sorted(str(p) for p in (out / "checkpoints").glob("step-*") if p.is_dir())
    export = out / "drafter"
    meta_path = out / "metadata.json"
    meta = json.loads(meta_path.read_text(encoding="utf-8")) if meta_path.exists() else {}
    held = [{"step": r["step"], "loss": r["loss"],
             **{k: r[k] for k in ("held_out_tau", "held_out_decode_tau", "held_out_tau_ratio",
                                  "held_out_tau_random", "held_out_tau_stopped") if k in r}}
            for r in records if "held_out_tau" in r]
    if res["rc"] != 0 and not checkpoints:
        raise SystemExit(f"real_target: dflash-train failed (rc {res['rc']}): "
                         f"{res['tail'][-1500:]}")
    last = records[-1] if records else {}
    return {"command": argv, "rc": res["rc"], "seconds": res["seconds"],
            "stopped": res["stopped"], "steps_planned": steps, "budget_s": budget,
            "probe_step_s": step_s, "steps_done": last.get("step"),
            "export": str(export) if export.exists() else None, "checkpoints": checkpoints,
            "held_out_tau": held, "last_record": last, "records": records,
            "config": meta.get("config"), "unguarded": meta.get("unguarded"),
            "attention": meta.get("attention"), "compile": meta.get("compile"),
            "tail": res["tail"][-1500:]}


def trained_drafter(run: Run) -> Path | None:
    """The train stage's export, else its latest checkpoint (a run stopped early)."""
    out = run.work / "drafter-run"
    if (out / "drafter" / "config.json").exists():
        return out / "drafter"
    steps = sorted(p for p in (out / "checkpoints").glob("step-*") if p.is_dir())
    return steps[-1] if steps else None


def eval_argv(run: Run, drafter: list[str], limit: int) -> list[str]:
    args = run.args
    return [*py_module("dflash.cli.evaluate"), *drafter, "--target", str(run.target_dir),
            "--prompts", str(run.work / "prompts-eval.jsonl"), "--limit", str(limit),
            "--max-new-tokens", str(args.eval_new_tokens), "--max-draft", str(DRAFT_CAP),
            "--dtype", args.eval_dtype, *device_flag(run), "--json"]


def _eval_jobs(run: Run) -> list[tuple[str, list[str], int]]:
    """(name, --drafter flags, prompts) of every drafter asked for that exists."""
    jobs: list[tuple[str, list[str], int]] = []
    for item in [n.strip() for n in run.args.eval_drafters.split(",") if n.strip()]:
        name, _, count = item.partition(":")
        try:
            limit = int(count) if count else run.args.eval_limit
        except ValueError:
            raise SystemExit(f"real_target: bad prompt count in --eval-drafters: {item!r}"
                             ) from None
        if name == "ngram":
            jobs.append(("ngram", ["--drafter", "ngram"], limit))
        elif name == "untrained":
            cfg_from = trained_drafter(run) or run.work / "probe" / "drafter"
            jobs.append(("untrained", ["--drafter", str(cfg_from), "--untrained",
                                       "--init-seed", str(run.args.seed)], limit))
        elif name in ("trained", "hybrid", "hybrid-useful"):
            found = trained_drafter(run)
            if found is None:
                log("eval", "no trained drafter: run the train stage first")
                continue
            spec = str(found) if name == "trained" else f"hybrid:{found}"
            extra = ["--lookup-branch", "useful"] if name == "hybrid-useful" else []
            jobs.append((name, ["--drafter", spec, *extra], limit))
        elif name == "checkpoints":
            # Every checkpoint but the last, which is the trained drafter's own step.
            ckpts = sorted(p for p in (run.work / "drafter-run" / "checkpoints").glob("step-*")
                           if p.is_dir())
            for ckpt in ckpts[:-1]:
                steps = int(ckpt.name.removeprefix("step-"))
                jobs.append((f"trained@{steps}", ["--drafter", str(ckpt)],
                             int(count) if count else run.args.checkpoint_prompts))
        else:
            raise SystemExit(f"real_target: unknown drafter {name!r} in --eval-drafters")
    seen: dict[str, int] = {}
    for i, (name, flags, limit) in enumerate(jobs):  # a drafter named twice: run twice
        seen[name] = seen.get(name, 0) + 1
        if seen[name] > 1:
            jobs[i] = (f"{name}#{seen[name]}", flags, limit)
    cycles = [c.strip() for c in run.args.eval_cycles.split(",") if c.strip()]
    if cycles == ["auto"]:
        return jobs
    # Each drafter on each cycle path, alternating drafters within a path.
    return [(f"{name}/{cycle}", [*flags, "--cycle", cycle], limit)
            for cycle in cycles for name, flags, limit in jobs]


def _compact(report: dict[str, Any]) -> dict[str, Any]:
    keep = ("drafter", "dtype", "device", "max_new_tokens", "prompts", "tokens", "tau",
            "tau_interval",
            "cycles", "max_draft", "target_seconds", "speculative_seconds", "speedup",
            "target_tokens_per_s", "speculative_tokens_per_s", "drafted",
            "draft_acceptance", "lossless", "mismatches", "acceptance_histogram",
            "warmup_seconds", "per_prompt", "cycle_in_target_forwards", "lookups",
            "both_verified", "captured_target_seconds", "speedup_captured",
            "cycle_in_captured_target_forwards", "captured_equal")
    return {k: report[k] for k in keep if k in report}


def stage_eval(run: Run) -> dict[str, Any]:
    earlier: dict[str, Any] = {}
    if run.has_result("eval"):
        earlier = run.result("eval").get("drafters", {})
    results: dict[str, Any] = dict(earlier)
    for name, flags, limit in _eval_jobs(run):
        left = run.seconds_left() - 5
        if left < 30:
            log("eval", f"skipping {name}: {left:.0f} s left before --deadline-s")
            results.setdefault("skipped", []).append(name)
            continue
        argv = eval_argv(run, flags, limit)
        res = run_cli(run, f"eval-{name.replace('@', '-').replace('/', '-')}", argv,
                      timeout=None if math.isinf(left) else left, grace_s=5)
        entry: dict[str, Any] = {"command": argv, "rc": res["rc"], "seconds": res["seconds"]}
        if "json" in res:
            entry.update(_compact(res["json"]))
            lo, hi = entry.get("tau_interval") or (entry["tau"], entry["tau"])
            captured = entry.get("speedup_captured")  # the static path's second clock only
            log("eval", f"{name}: tau {entry['tau']:.2f} ({lo:.2f}-{hi:.2f} over the prompts), "
                        f"speedup {entry['speedup']:.2f}x"
                        + (f" ({captured:.2f}x over captured)" if captured else "") + ", "
                        f"{entry['speculative_tokens_per_s']:.0f} tok/s, lossless "
                        f"{entry['lossless']}")
        else:
            entry["tail"] = res["tail"][-1500:]
        results[name] = entry
        # A run cut short still leaves every drafter measured so far.
        run.save_result("eval", {"drafters": results, "partial": True})
    summary = {name: {k: e.get(k) for k in ("tau", "speedup", "speculative_tokens_per_s",
                                            "target_tokens_per_s", "lossless", "prompts")}
               for name, e in results.items() if isinstance(e, dict) and "tau" in e}
    return {"drafters": results, "summary": summary, "draft_cap": DRAFT_CAP,
            "prompts_file": str(run.work / "prompts-eval.jsonl"),
            "new_tokens": run.args.eval_new_tokens, "dtype": run.args.eval_dtype}


