"""DFlash on one GPU: ceilings, training throughput/MFU, flex vs dense, cold vs warm start,
and the compile race. ``nox -s bench-gpu`` runs it; so can the device runner directly:

    python benchmarks/gpu_dflash.py --out $OUT --stages ceilings,train,dense
    python benchmarks/gpu_dflash.py --out $OUT --stages start,load

Every stage writes ``OUT/<stage>.json`` as soon as it finishes, so a run cut short by a
time limit still returns what it measured. Stages take a deadline from ``--budget``.
Random bf16 targets (named shapes) and random token data: throughput does not depend on
the weights, and nothing can be downloaded on the benchmark machine.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from bench_results import NVLS_OFF, write  # noqa: E402
from first_step import bytecode_state, first_step, load_speed  # noqa: E402

from dflash.compilation.kernels import unseal  # noqa: E402
from dflash.data import Example  # noqa: E402
from dflash.meter import measure_matmul_tflops  # noqa: E402
from dflash.presets import PRESETS  # noqa: E402
from dflash.target import load_target  # noqa: E402
from dflash.train import Trainer  # noqa: E402


def compile_stats() -> dict[str, Any]:
    """What Dynamo compiled in this process so far, and where the time went."""
    from torch._dynamo.utils import compile_times, counters

    try:
        times = compile_times(repr="str", aggregate=True)
    except Exception as exc:  # noqa: BLE001 - diagnostics only
        times = repr(exc)
    from torch._inductor import config as inductor_config

    return {"unique_graphs": counters["stats"].get("unique_graphs", 0),
            "inductor_compile_threads": inductor_config.compile_threads,
            "calls_captured": counters["stats"].get("calls_captured", 0),
            "times": str(times)[-4000:]}


# -- ceilings --------------------------------------------------------------------------------

def copy_bandwidth_gbs(device: torch.device, gib: float = 2.0, iters: int = 20) -> float:
    n = int(gib * 2**30) // 2
    src = torch.empty(n, dtype=torch.bfloat16, device=device).normal_()
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    for _ in range(iters):
        dst.copy_(src)
    torch.cuda.synchronize(device)
    return 2 * src.numel() * 2 * iters / (time.perf_counter() - t0) / 1e9  # read + write


def stage_ceilings(device: torch.device) -> dict[str, Any]:
    return {"matmul_bf16_tflops": measure_matmul_tflops(device, torch.bfloat16, size=8192),
            "d2d_copy_gbs": copy_bandwidth_gbs(device),
            "gpu": torch.cuda.get_device_name(device), "torch": torch.__version__,
            "torch_git": torch.version.git_version, "cuda": torch.version.cuda}


# -- training throughput ---------------------------------------------------------------------

def random_examples(vocab: int, seq: int, n: int, prompt: int, mask_id: int, seed: int = 0
                    ) -> list[Example]:
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (n, seq), generator=gen)
    ids[ids == mask_id] = 0
    mask = (0,) * prompt + (1,) * (seq - prompt)
    return [Example(input_ids=tuple(row), loss_mask=mask) for row in ids.tolist()]


def train_once(preset: str, target: Any, *, attention: str, seq: int, anchors: int,
               steps: int, peak: float, skip: int = 3) -> dict[str, Any]:
    """Warm-up (compile), then ``steps`` logged steps; medians over the steps after skip."""
    unseal()
    compile_mode = "on" if attention == "flex" else "off"
    cfg = dataclasses.replace(
        PRESETS[preset](), attention=attention, compile=compile_mode, steps=steps,
        log_every=1, eval_every=0, save_every=0, held_out=1, buckets=(seq,), anchors=anchors,
        peak_tflops=peak, out=tempfile.mkdtemp(prefix="dflash-bench-"))
    examples = random_examples(target.vocab_size, seq, 24, prompt=seq // 12,
                               mask_id=target.mask_token_id)
    torch.cuda.reset_peak_memory_stats()
    trainer = Trainer(cfg, target=target, examples=examples)
    warm = trainer.warmup()
    records: list[dict[str, Any]] = []
    trainer.run(records.append, final_save=False)
    tail = records[skip:]

    def med(key: str) -> float:
        return float(statistics.median(r[key] for r in tail))

    result = {"preset": preset, "attention": attention, "compiled": trainer.rt.compile,
              "seq": seq, "anchors": anchors, "block_size": cfg.block_size,
              "steps_measured": len(tail), "warmup_s": warm,
              "step_ms": 1000 * med("step_s"), "ctx_tok_s": med("ctx_tok_s"),
              "draft_tok_s": med("draft_tok_s"), "tflops": med("tflops"), "mfu": med("mfu"),
              "peak_mem_gb": max(r.get("peak_mem_gb", 0.0) for r in records),
              "loss_first": records[0]["loss"], "loss_last": records[-1]["loss"],
              "warmup_phases_s": trainer.warm.phases, "compile": compile_stats()}
    del trainer
    torch.cuda.empty_cache()
    return result


def stage_train(out: Path, device: torch.device, peak: float, steps: int,
                presets: list[str], name: str = "train",
                attentions: tuple[str, ...] = ("flex", "sdpa")) -> None:
    results: dict[str, Any] = {}
    for preset in presets:
        t0 = time.perf_counter()
        target = load_target(PRESETS[preset]().target, device=device, dtype=torch.bfloat16)
        results[f"{preset}/build_s"] = time.perf_counter() - t0
        for attention in attentions:
            key = f"{preset}/{attention}"
            try:
                results[key] = train_once(preset, target, attention=attention, seq=3072,
                                          anchors=512, steps=steps, peak=peak)
            except torch.OutOfMemoryError as exc:
                results[key] = {"error": f"OOM: {str(exc).splitlines()[0]}"}
            write(out, name, results)
        flex, dense = results.get(f"{preset}/flex", {}), results.get(f"{preset}/sdpa", {})
        # both timed (--train-attention flex,sdpa): the ratio
        if preset == "qwen3-8b-shape" and "step_ms" in flex and "step_ms" in dense:
            results["flex_speedup_8b_s3072"] = dense["step_ms"] / flex["step_ms"]
        del target
        torch.cuda.empty_cache()
        write(out, name, results)


def stage_dense(out: Path, device: torch.device, peak: float, deadline: float,
                attentions: list[str], seqs: list[int]) -> None:
    """Dense SDPA vs flex as S grows (anchors scaled with S): where dense runs out.
    Each new S is a cold flex compile (static shapes), so ``--dense-attn sdpa`` skips flex."""
    target = load_target("qwen3-8b-shape", device=device, dtype=torch.bfloat16)
    results: list[dict[str, Any]] = []
    for seq in seqs:
        for attention in attentions:
            if time.monotonic() > deadline:
                results.append({"seq": seq, "attention": attention, "skipped": "time"})
                continue
            anchors = 512 * seq // 3072
            try:
                r = train_once("qwen3-8b-shape", target, attention=attention, seq=seq,
                               anchors=anchors, steps=6, peak=peak, skip=2)
            except torch.OutOfMemoryError as exc:
                r = {"seq": seq, "attention": attention,
                     "error": f"OOM: {str(exc).splitlines()[0][:200]}"}
                torch.cuda.empty_cache()
            results.append(r)
            write(out, "dense", results)


def stage_gpu_tests(out: Path) -> None:
    """tests/dflash/test_gpu.py, called directly (pytest may be missing on the machine)."""
    import importlib.util
    import traceback

    spec = importlib.util.spec_from_file_location("test_gpu", ROOT / "tests/dflash/test_gpu.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    results = {}
    for name in sorted(n for n in dir(module) if n.startswith("test_")):
        t0 = time.perf_counter()
        try:
            getattr(module, name)()
            results[name] = {"outcome": "passed", "s": time.perf_counter() - t0}
        except Exception as exc:  # noqa: BLE001 - the outcome is the record
            results[name] = {"outcome": "failed", "error": f"{type(exc).__name__}: {exc}"[:2000],
                             "where": traceback.format_exc().splitlines()[-6:]}
        write(out, "gpu_tests", results)
        # One short line each: the JSON line above is cut at 700 characters, and a log
        # may be all that comes back from the machine.
        print(f"gpu test {name}: {results[name]['outcome']}", flush=True)
    failed = sorted(n for n, r in results.items() if r["outcome"] != "passed")
    print(f"gpu tests: {len(results) - len(failed)} of {len(results)} passed"
          + (f"; failed: {', '.join(failed)}" if failed else ""), flush=True)
    unseal()


def stage_smoke(out: Path, device: torch.device, peak: float) -> None:
    target = load_target("qwen3-8b-shape", device=device, dtype=torch.bfloat16)
    r = train_once("qwen3-8b-shape", target, attention="flex", seq=3072, anchors=512,
                   steps=6, peak=peak, skip=2)
    write(out, "smoke", r)


# -- cold vs warm start ----------------------------------------------------------------------

def cache_env(root: Path) -> dict[str, str]:
    return {**os.environ, **NVLS_OFF, "TORCHINDUCTOR_CACHE_DIR": str(root / "inductor"),
            "TRITON_CACHE_DIR": str(root / "triton")}


def stage_start(out: Path, preset: str, deadline: float, mega: bool) -> None:
    """dflash-train's own time to its first step (:mod:`first_step`), each a fresh process:
    ``first``, a new machine (empty compile folders, Mega-Cache store, and dflash's and
    envguard's cache folders: bytecode under PYTHONDONTWRITEBYTECODE, the matmul peak);
    ``cold``, the compile folders emptied as in the incident (the rest as the first run
    left it); ``warm``, a second process on the same folders, as every later run on a
    machine; with ``mega`` a last one with empty compile folders and the store the first
    run filled (a new machine with the same build)."""
    base = Path(tempfile.mkdtemp(prefix="dflash-start-"))
    store = f"--set=mega_cache={base / 'store'}"
    runs: dict[str, Any] = {"preset": preset, "bytecode": bytecode_state()}
    plan = [("first", "a", 150.0), ("cold", "b", 90.0), ("warm", "b", 60.0)] + (
        [("mega", "c", 60.0)] if mega else [])
    tools = {"DFLASH_CACHE_DIR": str(base / "dflash-cache"),
             "ENVGUARD_CACHE_DIR": str(base / "envguard-cache")}
    for name, folders, limit in plan:
        left = deadline - time.monotonic()
        if left < 20:
            runs[name] = {"skipped": "time"}
            continue
        runs[name] = first_step(preset, base / f"run-{name}",
                                {**cache_env(base / folders), **tools}, min(limit, left),
                                (store,))
        write(out, "start", runs)
    write(out, "start", runs)


# -- the race -------------------------------------------------------------------------------

def stage_race(out: Path, runs: int, timeout: float, seq: int, modes: list[str]) -> None:
    results: dict[str, Any] = {}
    for mode in modes:
        outcomes = []
        for i in range(runs):
            root = Path(tempfile.mkdtemp(prefix=f"dflash-race-{mode}-{i}-"))
            cmd = [sys.executable, "-m", "dflash.compilation.race", "--mode", mode,
                   "--threads", "3", "--seq", str(seq), "--timeout", str(timeout)]
            t0 = time.perf_counter()
            try:
                proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT,
                                      env=cache_env(root), timeout=timeout + 30)
                line = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else "{}"
                r = json.loads(line)
                verdict = ("hang" if r.get("hang") else
                           "ok" if r.get("ok") == 3 and not r.get("fx_tracing_flag_after")
                           else "error")
                outcomes.append({"verdict": verdict, "exit": proc.returncode,
                                 "threads": r.get("outcomes"), "warmup_s": r.get("warmup_s"),
                                 "total_s": r.get("total_s"),
                                 "stderr_tail": proc.stderr.strip().splitlines()[-1:]})
            except subprocess.TimeoutExpired:
                outcomes.append({"verdict": "hang", "exit": None, "killed_after_s":
                                 time.perf_counter() - t0})
            results[mode] = {"runs": outcomes,
                             "summary": {v: sum(o["verdict"] == v for o in outcomes)
                                         for v in ("ok", "error", "hang")}}
            write(out, "race", results)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=os.environ.get("OUT", "bench-out"))
    p.add_argument("--stages", default="ceilings,train,dense,start,load,race")
    p.add_argument("--budget", type=float, default=560.0, help="seconds for this call")
    p.add_argument("--steps", type=int, default=25)
    p.add_argument("--train-attention", default="flex,sdpa",
                   help="train: the attention paths to time (flex, sdpa)")
    p.add_argument("--race-runs", type=int, default=5)
    p.add_argument("--race-timeout", type=float, default=60.0)
    p.add_argument("--race-seq", type=int, default=2048)
    p.add_argument("--race-modes", default="guarded,naive")
    p.add_argument("--dense-attn", default="sdpa,flex")
    p.add_argument("--dense-seqs", default="8192,16384,32768")
    p.add_argument("--start-preset", default="qwen3-8b-shape")
    p.add_argument("--start-mega", action="store_true",
                   help="start: also a process with empty compile folders and the Mega-Cache")
    p.add_argument("--load-preset", default="qwen3-8b-shape",
                   help="load: the named shape saved with save_pretrained and loaded back")
    p.add_argument("--load-reserve", type=float, default=90.0,
                   help="seconds of the budget the start stage leaves to the load stage")
    args = p.parse_args()
    os.environ.update(NVLS_OFF)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + args.budget
    device = torch.device("cuda")
    stages = args.stages.split(",")
    peaks: list[float] = []

    def peak() -> float:  # measured once, by the first stage that needs it
        if not peaks:
            peaks.append(measure_matmul_tflops(device, torch.bfloat16, size=8192))
        return peaks[0]

    if "ceilings" in stages:
        ceil = stage_ceilings(device)
        write(out, "ceilings", ceil)
        peaks.append(ceil["matmul_bf16_tflops"])
    later = stages[stages.index("start"):] if "start" in stages else []
    reserve = args.load_reserve if "load" in later else 0.0
    runners = {
        "ceilings": lambda: None,
        "gpu-tests": lambda: stage_gpu_tests(out),
        "smoke": lambda: stage_smoke(out, device, peak()),
        "train": lambda: stage_train(out, device, peak(), args.steps, ["qwen3-8b-shape"],
                                     attentions=tuple(args.train_attention.split(","))),
        "train-1.7b": lambda: stage_train(out, device, peak(), args.steps,
                                          ["qwen3-1.7b-shape"], "train_1_7b"),
        "dense": lambda: stage_dense(out, device, peak(), deadline - 60,
                                     args.dense_attn.split(","),
                                     [int(x) for x in args.dense_seqs.split(",")]),
        "start": lambda: stage_start(out, args.start_preset, deadline - reserve,
                                     args.start_mega),
        "load": lambda: write(out, "load", load_speed(args.load_preset, deadline)),
        "race": lambda: stage_race(out, args.race_runs, args.race_timeout, args.race_seq,
                                   args.race_modes.split(",")),
    }
    unknown = [s for s in stages if s not in runners]
    if unknown:
        p.error(f"unknown stage(s) {unknown}; known: {', '.join(runners)}")
    for stage in stages:  # in the order given, so the cheap ones can go first
        runners[stage]()
    return 0


if __name__ == "__main__":
    sys.exit(main())
