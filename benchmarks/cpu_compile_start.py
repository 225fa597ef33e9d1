"""Time to the first compiled call on CPU: cold cache, warm cache, Mega-Cache restored.

    .venv/bin/python benchmarks/cpu_compile_start.py --reps 3

Each run is a fresh process of the guarded race harness (one thread, flex_attention
forward compiled on the main thread at S=256), timed from launch by this script:
cold (empty inductor + triton dirs; saves a Mega-Cache artifact), warm (same dirs), and
mega (empty dirs plus the artifact). CPU has no flex backward, so this is the forward
only; the GPU figures with the full trainer are in docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def once(root: Path, cache: str, store: Path | None) -> dict[str, float]:
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(root / cache / "inductor"),
           "TRITON_CACHE_DIR": str(root / cache / "triton")}
    cmd = [sys.executable, "-m", "dflash.compilation.race", "--mode", "guarded", "--threads", "1",
           "--iters", "1", "--seq", "256", "--device", "cpu",
           "--mega-cache", str(store) if store else "off"]
    t0 = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True).stdout
    wall = time.perf_counter() - t0
    r = json.loads(out.strip().splitlines()[-1])
    return {"process_s": wall, "warmup_s": r["warmup_s"]}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--reps", type=int, default=3)
    args = p.parse_args()
    rows: dict[str, list[dict[str, float]]] = {"cold": [], "warm": [], "mega": []}
    for i in range(args.reps):
        root = Path(tempfile.mkdtemp(prefix=f"compile-start-{i}-"))
        store = root / "store"
        rows["cold"].append(once(root, "a", store))
        rows["warm"].append(once(root, "a", None))
        rows["mega"].append(once(root, "b", store))
    cold = statistics.median(r["process_s"] for r in rows["cold"])
    print("| start | process (median) | warm-up (median) | vs cold |")
    print("|---|---:|---:|---:|")
    for name, rs in rows.items():
        proc = statistics.median(r["process_s"] for r in rs)
        warm = statistics.median(r["warmup_s"] for r in rs)
        print(f"| {name} | {proc:.1f} s | {warm:.1f} s | {100 * proc / cold:.0f} % |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
