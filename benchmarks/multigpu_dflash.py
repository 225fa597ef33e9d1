"""dflash and envguard fleet on several GPUs of one host (issue 9). One script, stages:

    python benchmarks/multigpu_dflash.py --out $OUT --gpus 8 --stages train,split,fleet,race

* ``train``: ``torchrun --nproc-per-node g -m dflash.cli.train`` (colocated, FSDP2) at 1 and
  at G GPUs: context tokens/s, MFU, scaling efficiency = tok/s(G) / (G * tok/s(1)).
* ``split``: the same at G GPUs with ``--target-ranks K``.
* ``fleet``: ``envguard fleet snapshot`` over G ranks; then again with one rank's
  environment perturbed (an env var and a tracked file): the report must name it.
* ``race``: ``--race-launches`` cold launches of G processes, each rank warming up by
  itself (the guarded harness, fresh shared cache dir per launch): count failures/hangs.

Every child gets NVLink multicast off. Random-token data (nothing can be downloaded on
the machine); the first training launch saves a Mega-Cache artifact that the later ones
load, so only one cold compile is paid. Results: ``OUT/<stage>.json``, written as each
stage finishes. With ``--gpus 1`` it runs what one GPU allows (train at 1, fleet of one,
race at 1), which is how it was tried before a multi-GPU machine was lent.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench_results import NVLS_OFF, write  # noqa: E402


def child_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "ENVGUARD_VERIFIED"}
    env.update(NVLS_OFF)
    env.setdefault("OMP_NUM_THREADS", "4")
    env.update(extra)
    return env


def torchrun(n: int, args: list[str], env: dict[str, str], timeout: float
             ) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
           str(n), *args]
    try:
        return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        return subprocess.CompletedProcess(cmd, 124, str(exc.stdout or ""),
                                           f"timeout after {timeout:.0f} s")


def random_data(path: Path, vocab: int, seq: int, rows: int) -> None:
    rng = random.Random(0)  # noqa: S311 - benchmark tokens, not secrets
    prompt = seq // 12
    with open(path, "w") as fh:
        for _ in range(rows):
            ids = [rng.randrange(vocab - 1) for _ in range(seq)]
            fh.write(json.dumps({"input_ids": ids,
                                 "loss_mask": [0] * prompt + [1] * (seq - prompt)}) + "\n")


def train_run(n: int, args: argparse.Namespace, data: Path, extra: list[str],
              env: dict[str, str]) -> dict[str, Any]:
    out = Path(tempfile.mkdtemp(prefix=f"dflash-g{n}-")) / "run"
    sets = [f"--set={kv}" for kv in ("log_every=1", "save_every=0", "eval_every=0",
                                     "held_out=1", f"mega_cache={args.mega}")]
    t0 = time.perf_counter()
    proc = torchrun(n, ["-m", "dflash.cli.train", "--preset", args.preset, "--unguarded", "--quiet",
                        "--data", str(data), "--out", str(out), f"--steps={args.steps}",
                        *sets, *extra], env, args.timeout)
    wall = time.perf_counter() - t0
    metrics = out / "metrics.jsonl"
    if proc.returncode != 0 or not metrics.exists():
        return {"gpus": n, "error": f"exit {proc.returncode}", "wall_s": wall,
                "stderr_tail": proc.stderr.strip().splitlines()[-8:]}
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    tail = records[args.skip:] or records

    def med(key: str) -> float:
        return float(statistics.median(r[key] for r in tail))

    return {"gpus": n, "extra": extra, "wall_s": wall, "steps_measured": len(tail),
            "step_ms": 1000 * med("step_s"), "ctx_tok_s": med("ctx_tok_s"),
            "draft_tok_s": med("draft_tok_s"), "mfu": med("mfu"),
            "peak_mem_gb": max(r.get("peak_mem_gb", 0.0) for r in records),
            "loss_first": records[0]["loss"], "loss_last": records[-1]["loss"]}


def stage_train(out: Path, args: argparse.Namespace, data: Path, env: dict[str, str]) -> None:
    results: dict[str, Any] = {"preset": args.preset}
    for n in sorted({1, args.gpus}):
        results[f"colocated_g{n}"] = train_run(n, args, data, [], env)
        write(out, "train", results)
    one, many = results["colocated_g1"], results[f"colocated_g{args.gpus}"]
    if args.gpus > 1 and "ctx_tok_s" in one and "ctx_tok_s" in many:
        results["scaling_efficiency"] = many["ctx_tok_s"] / (args.gpus * one["ctx_tok_s"])
    write(out, "train", results)


def stage_split(out: Path, args: argparse.Namespace, data: Path, env: dict[str, str]) -> None:
    if args.gpus < 2:
        write(out, "split", {"skipped": "split roles need at least 2 GPUs"})
        return
    k = args.target_ranks or max(1, round(0.36 * args.gpus))  # the 8B FLOP share
    results = {"target_ranks": k,
               "split": train_run(args.gpus, args, data, ["--target-ranks", str(k)], env)}
    write(out, "split", results)


FLEET_WRAPPER = """\
import os, sys
from pathlib import Path
base, odd = Path(sys.argv[1]), sys.argv[2]
if os.environ["RANK"] == odd:
    os.environ["NCCL_DEBUG"] = "INFO"
    os.chdir(base / "odd")
else:
    os.chdir(base / "same")
from envguard.cli import main
sys.exit(main(["fleet", "snapshot", "-o", str(base / sys.argv[3]), "--file", "config.yaml",
               "--no-project-config", "--timeout", "120"]))
"""


def stage_fleet(out: Path, args: argparse.Namespace, env: dict[str, str]) -> None:
    base = Path(tempfile.mkdtemp(prefix="fleet-"))
    for name, text in (("same", "lr: 0.1\n"), ("odd", "lr: 0.3\n")):
        (base / name).mkdir()
        (base / name / "config.yaml").write_text(text)
    wrapper = base / "wrapper.py"
    wrapper.write_text(FLEET_WRAPPER)
    results: dict[str, Any] = {"gpus": args.gpus}
    odd = str(args.gpus - 1) if args.gpus > 1 else "none"
    for label, odd_rank in (("clean", "none"), ("perturbed", odd)):
        t0 = time.perf_counter()
        proc = torchrun(args.gpus, [str(wrapper), str(base), odd_rank, f"{label}.json"],
                        child_env(PYTHONPATH=str(ROOT)), args.timeout)
        report = [line for line in proc.stdout.splitlines() if line.strip()]
        results[label] = {"exit": proc.returncode, "wall_s": time.perf_counter() - t0,
                          "odd_rank": odd_rank, "report": report[-20:],
                          "stderr_tail": proc.stderr.strip().splitlines()[-4:]}
        write(out, "fleet", results)


def stage_race(out: Path, args: argparse.Namespace, env: dict[str, str]) -> None:
    launches = []
    for i in range(args.race_launches):
        cache = Path(tempfile.mkdtemp(prefix=f"race-{i}-"))
        run_env = child_env(TORCHINDUCTOR_CACHE_DIR=str(cache / "inductor"),
                            TRITON_CACHE_DIR=str(cache / "triton"))
        t0 = time.perf_counter()
        proc = torchrun(args.gpus, ["-m", "dflash.compilation.race", "--mode", "guarded",
                                    "--threads", "3", "--seq", "2048", "--timeout", "120"],
                        run_env, 300)
        lines = [json.loads(x) for x in proc.stdout.splitlines() if x.startswith("{")]
        ok = sum(1 for r in lines if r.get("ok") == 3 and not r.get("hang"))
        launches.append({"exit": proc.returncode, "ranks_ok": ok, "ranks": len(lines),
                         "wall_s": time.perf_counter() - t0,
                         "warmup_s": [r.get("warmup_s") for r in lines],
                         "stderr_tail": proc.stderr.strip().splitlines()[-3:]})
        summary = {"launches": len(launches),
                   "all_ok": sum(1 for x in launches if x["exit"] == 0
                                 and x["ranks_ok"] == args.gpus)}
        write(out, "race", {"gpus": args.gpus, "launches": launches, "summary": summary})


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=os.environ.get("OUT", "multigpu-out"))
    p.add_argument("--gpus", type=int, required=True)
    p.add_argument("--stages", default="train,split,fleet,race")
    p.add_argument("--preset", default="qwen3-8b-shape")
    p.add_argument("--steps", type=int, default=25)
    p.add_argument("--skip", type=int, default=3)
    p.add_argument("--target-ranks", type=int, default=0)
    p.add_argument("--race-launches", type=int, default=3)
    p.add_argument("--timeout", type=float, default=900.0)
    p.add_argument("--mega", help="Mega-Cache store (default: OUT/mega-cache)")
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    args.mega = args.mega or str(out / "mega-cache")
    stages = args.stages.split(",")
    env = child_env()
    data = Path(tempfile.mkdtemp(prefix="data-")) / "train.jsonl"
    if "train" in stages or "split" in stages:
        from dflash.presets import PRESETS, TARGET_SHAPES

        cfg = PRESETS[args.preset]()
        random_data(data, TARGET_SHAPES[cfg.target].vocab_size, max(cfg.buckets), rows=64)
    if "train" in stages:
        stage_train(out, args, data, env)
    if "split" in stages:
        stage_split(out, args, data, env)
    if "fleet" in stages:
        stage_fleet(out, args, env)
    if "race" in stages:
        stage_race(out, args, env)
    return 0


if __name__ == "__main__":
    sys.exit(main())
