"""dflash-train's start before the target, this tree against another (here: the gate beside
torch's import and the imports without the cyclic collector, against the tree before).

    python benchmarks/gate_overlap.py --old .abref --reps 5 --out /tmp/gate-overlap.json

Each launch is a fresh ``python -m dflash.cli.train --preset tiny`` (the gate checks this
checkout's lock; ``--unguarded`` so a lock of another machine still starts), timed from
launch to its "building the target" line (the gate and torch's import are all that come
before it) and to its first metrics line. The two trees alternate, launch by launch, on
the same interpreter, caches and files; ``--old`` is a tree extracted with
``git archive <commit> dflash envguard``.
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

ROOT = Path(__file__).resolve().parents[1]


def launch(tree: Path) -> dict[str, float]:
    out = Path(tempfile.mkdtemp(prefix="gate-overlap-")) / "run"
    cmd = [sys.executable, "-m", "dflash.cli.train", "--preset", "tiny", "--unguarded",
           "--out", str(out), "--steps", "1", "--set=log_every=1", "--set=save_every=0",
           "--set=eval_every=0"]
    env = {**os.environ, "PYTHONPATH": str(tree)}
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=tree, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    seen: dict[str, float] = {}
    assert proc.stderr is not None
    for line in proc.stderr:
        if "building the target" in line and "target" not in seen:
            seen["target"] = time.perf_counter() - t0
    proc.wait()
    seen["exit"] = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{tree}: exit {proc.returncode}")
    return seen


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--old", type=Path, required=True, help="the tree to compare with")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    trees = {"new": ROOT, "old": args.old.resolve()}
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    launch(ROOT)  # warms the page cache and the kept bytecode for both
    for _ in range(args.reps):
        for name, tree in trees.items():
            runs[name].append(launch(tree))
    summary = {name: {key: statistics.median(r[key] for r in rs) for key in ("target", "exit")}
               for name, rs in runs.items()}
    doc = {"command": " ".join(sys.argv), "runs": runs, "median": summary,
           "old_over_new_to_target": summary["old"]["target"] / summary["new"]["target"]}
    args.out.write_text(json.dumps(doc, indent=1), encoding="utf-8")
    print(json.dumps(summary, indent=1))
    print(f"to the target: old / new = {doc['old_over_new_to_target']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
