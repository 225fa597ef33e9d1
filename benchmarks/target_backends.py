"""dflash's own Qwen3 against transformers' for the same target, in one run (A/B).

    python benchmarks/target_backends.py --reps 7                       # CPU
    python3 benchmarks/target_backends.py --device cuda --build-preset qwen3-8b-shape \
        --build-device cuda --decode-preset qwen3-1.7b-shape --reps 5    # GPU

Two measurements, each backend in turn (``DFLASH_TARGET_BACKEND``), alternating so that a
slow minute of the machine hits both:

build   a fresh process from launch to a built target (``--build-preset`` on
        ``--build-device``; ``meta`` builds the shapes only): the interpreter, ``import
        torch``, dflash, and whatever the backend imports. This is the target's share of
        the trainer's start.
decode  greedy decoding at batch 1 through ``TargetModel.forward_cached`` (what
        ``dflash-eval``'s target-only baseline and verify steps run): tokens/s after a
        warm-up, in one process per backend.

Prints one JSON document (medians, and own / transformers ratios).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BACKENDS = ("dflash", "transformers")

BUILD = """
import sys, torch
from dflash.target import load_target
t = load_target(sys.argv[1], device=sys.argv[2], dtype=torch.bfloat16)
print(type(t.model).__module__)
"""

DECODE = """
import json, sys, time, torch
from dflash.target import load_target
preset, device, tokens = sys.argv[1], sys.argv[2], int(sys.argv[3])
dtype = torch.float32 if device == "cpu" else torch.bfloat16
t = load_target(preset, device=device, dtype=dtype)
def sync():
    if t.device.type == "cuda":
        torch.cuda.synchronize(t.device)
def greedy(n):
    cache = t.new_cache()
    ids = torch.arange(1, 33, device=t.device)[None] % (t.vocab_size - 1)
    logits, _ = t.forward_cached(ids, cache, 0)
    pos = ids.shape[1]
    for _ in range(n):
        nxt = logits[:, -1:].argmax(-1)
        logits, _ = t.forward_cached(nxt, cache, pos)
        pos += 1
    sync()
greedy(8)
start = time.perf_counter()
greedy(tokens)
print(json.dumps({"tokens_per_s": tokens / (time.perf_counter() - start),
                  "class": type(t.model).__module__}))
"""


def _run(code: str, backend: str, *args: str) -> tuple[float, str]:
    env = {**os.environ, "DFLASH_TARGET_BACKEND": backend, "PYTHONPATH": str(ROOT)}
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900, check=False)
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{backend}: failed: {proc.stderr[-2000:]}")
    return seconds, proc.stdout.strip().splitlines()[-1]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--device", default="cpu", help="decode device")
    p.add_argument("--build-preset", default="qwen3-8b-shape")
    p.add_argument("--build-device", default="meta")
    p.add_argument("--decode-preset", default="tiny")
    p.add_argument("--decode-tokens", type=int, default=256)
    p.add_argument("--decode-reps", type=int, default=3)
    args = p.parse_args()
    build: dict[str, list[float]] = {b: [] for b in BACKENDS}
    classes: dict[str, str] = {}
    for _ in range(args.reps):
        for backend in BACKENDS:
            seconds, cls = _run(BUILD, backend, args.build_preset, args.build_device)
            build[backend].append(seconds)
            classes[backend] = cls
    decode: dict[str, list[float]] = {b: [] for b in BACKENDS}
    for _ in range(args.decode_reps):
        for backend in BACKENDS:
            _, line = _run(DECODE, backend, args.decode_preset, args.device,
                           str(args.decode_tokens))
            decode[backend].append(json.loads(line)["tokens_per_s"])
    med = {k: {b: statistics.median(v) for b, v in d.items()}
           for k, d in (("build_s", build), ("decode_tokens_per_s", decode))}
    result: dict[str, Any] = {
        "build": {"preset": args.build_preset, "device": args.build_device,
                  "reps": args.reps, "seconds": build, "median_s": med["build_s"],
                  "own_over_transformers": med["build_s"]["dflash"]
                  / med["build_s"]["transformers"]},
        "decode": {"preset": args.decode_preset, "device": args.device,
                   "tokens": args.decode_tokens, "tokens_per_s": decode,
                   "median_tokens_per_s": med["decode_tokens_per_s"],
                   "own_over_transformers": med["decode_tokens_per_s"]["dflash"]
                   / med["decode_tokens_per_s"]["transformers"]},
        "classes": classes, "python": sys.version.split()[0],
    }
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
