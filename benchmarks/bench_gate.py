"""The gate's overhead: ``envguard run -- CMD`` against running CMD directly, in one run.

    python benchmarks/bench_gate.py [--python PY] [--lock lockfiles/dflash-train.toml]

The command is ``PY -c pass`` (so the child costs the same in both columns) and the
lock is the bundled one; the environment checked is PY's. Overhead = median(gated) −
median(direct). Also times ``envguard check``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def timed(cmd: list[str], env: dict[str, str], reps: int) -> tuple[list[float], int]:
    out, code = [], 0
    for _ in range(reps):
        start = time.perf_counter()
        code = subprocess.run(cmd, capture_output=True, env=env, cwd=ROOT, check=False).returncode
        out.append(time.perf_counter() - start)
    return out, code


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--lock", default=str(ROOT / "lockfiles" / "dflash-train.toml"))
    parser.add_argument("--reps", type=int, default=11)
    parser.add_argument("--json", metavar="OUT")
    args = parser.parse_args()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    envguard = [args.python, "-m", "envguard"]
    child = [args.python, "-c", "pass"]
    gated = [*envguard, "run", "--lock", args.lock, "--python", args.python, "--", *child]
    check = [*envguard, "check", "--lock", args.lock, "--python", args.python]
    for cmd in (gated, child, check):  # warm-up: bytecode, RECORD cache, page cache
        subprocess.run(cmd, capture_output=True, env=env, cwd=ROOT, check=False)
    t_gated, rc_gated = timed(gated, env, args.reps)
    t_child, _ = timed(child, env, args.reps)
    t_check, rc_check = timed(check, env, args.reps)
    res = {
        "gated_s": statistics.median(t_gated), "direct_s": statistics.median(t_child),
        "check_s": statistics.median(t_check), "gate_exit": rc_gated, "check_exit": rc_check,
        "overhead_s": statistics.median(t_gated) - statistics.median(t_child),
        "host": platform.node(), "cpus": os.cpu_count(), "python": platform.python_version(),
        "commands": {"gated": " ".join(gated), "direct": " ".join(child),
                     "check": " ".join(check)},
    }
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2) + "\n")
    print(f"{res['cpus']} CPUs, Python {res['python']}; gate exit {rc_gated}, check exit "
          f"{rc_check} (0 = the environment matched the lock)")
    print("| measure | median | bar |\n|---|---|---|")
    print(f"| `envguard run --lock L -- PY -c pass` | {res['gated_s']:.3f} s | |")
    print(f"| `PY -c pass` (the command alone) | {res['direct_s']:.3f} s | |")
    print(f"| gate overhead before the child starts | **{res['overhead_s']:.3f} s** | ≤ 0.3 s |")
    print(f"| `envguard check --lock L` | {res['check_s']:.3f} s | |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
