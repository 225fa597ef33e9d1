"""torch's and the compiler stack's import with and without the cyclic collector running
(:mod:`dflash.compilation.imports`), in fresh interpreters, alternating.

    env -u PYTHONDONTWRITEBYTECODE .venv/bin/python benchmarks/import_gc.py --reps 5 \\
        --out /tmp/import-gc.json

Each process imports torch, then what ``torch.compile`` and its first call import (dynamo,
inductor's ``compile_fx``), timing both; ``on`` as Python starts, ``off`` under
:func:`dflash.compilation.imports.without_collection` as dflash-train does.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHILD = r"""
import json, sys, time
sys.path.insert(0, sys.argv[2])
from dflash.compilation.imports import import_compiler, import_torch
t0 = time.perf_counter()
if sys.argv[1] == "off":
    import_torch()
else:
    import torch
t1 = time.perf_counter()
if sys.argv[1] == "off":
    import_compiler()
else:
    import torch._dynamo, torch._inductor.compile_fx
t2 = time.perf_counter()
print(json.dumps({"torch": t1 - t0, "compiler": t2 - t1, "total": t2 - t0}))
"""


def once(mode: str) -> dict[str, float]:
    out = subprocess.run([sys.executable, "-c", CHILD, mode, str(ROOT)], check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    once("on")  # the page cache and bytecode warm for both
    runs: dict[str, list[dict[str, float]]] = {"on": [], "off": []}
    for _ in range(args.reps):
        for mode in runs:
            runs[mode].append(once(mode))
    median = {mode: {k: statistics.median(r[k] for r in rs) for k in ("torch", "compiler",
                                                                        "total")}
              for mode, rs in runs.items()}
    doc = {"command": " ".join(sys.argv), "runs": runs, "median": median,
           "on_over_off": {k: median["on"][k] / median["off"][k] for k in median["on"]}}
    args.out.write_text(json.dumps(doc, indent=1), encoding="utf-8")
    print(json.dumps({"median": median, "on_over_off": doc["on_over_off"]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
