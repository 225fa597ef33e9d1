"""What a warm dflash start spends before its warm-up, in fresh processes on one GPU.

Each rep is a new ``python -c`` (bytecode kept from the first): ``import torch``, the
CUDA context (the first CUDA tensor), and ``torch.compile(flex_attention)`` (which
imports dynamo and inductor), timed one after another (``serial``), and with the
context made in a thread while the main thread makes the compile handle
(``overlapped``: the context is made inside an op, where torch releases the GIL). The
two kinds alternate, so a slow minute hits both. Prints and writes one JSON document.

    python3 benchmarks/warm_parts.py --out $OUT/warm_parts.json --reps 4
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

CODE = r'''
import json, sys, threading, time
t0 = time.perf_counter()
import torch
from torch.nn.attention.flex_attention import flex_attention
t1 = time.perf_counter()
marks = {"import_torch": t1 - t0}
if sys.argv[1] == "serial":
    torch.empty(1, device="cuda")
    t2 = time.perf_counter()
    torch.compile(flex_attention, dynamic=False)
    t3 = time.perf_counter()
    marks.update(context=t2 - t1, compile_handle=t3 - t2)
else:
    made = {}
    def context():
        s = time.perf_counter()
        torch.empty(1, device="cuda")
        made["context"] = time.perf_counter() - s
    th = threading.Thread(target=context)
    th.start()
    s = time.perf_counter()
    torch.compile(flex_attention, dynamic=False)
    marks["compile_handle"] = time.perf_counter() - s
    th.join()
    marks["context"] = made["context"]
marks["after_import"] = time.perf_counter() - t1
print(json.dumps(marks))
'''


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--reps", type=int, default=4)
    args = p.parse_args()
    subprocess.run([sys.executable, "-c", CODE, "serial"], check=True,
                   capture_output=True)  # bytecode and page cache, not counted
    runs: dict[str, list[dict[str, float]]] = {"serial": [], "overlapped": []}
    for _ in range(args.reps):
        for kind in runs:
            proc = subprocess.run([sys.executable, "-c", CODE, kind], check=True,
                                  capture_output=True, text=True)
            runs[kind].append(json.loads(proc.stdout.strip().splitlines()[-1]))
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps({"runs": runs}, indent=1), encoding="utf-8")
    medians = {kind: {key: statistics.median(r[key] for r in rs) for key in rs[0]}
               for kind, rs in runs.items()}
    doc = {"runs": runs, "medians": medians}
    args.out.write_text(json.dumps(doc, indent=1), encoding="utf-8")
    print(json.dumps(medians, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
