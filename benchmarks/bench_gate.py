"""The gate's overhead: ``envguard run -- CMD`` against running CMD directly, in one run.

    python benchmarks/bench_gate.py [--python PY] [--lock lockfiles/dflash-train.toml]
        [--envguard CMD]

``--envguard`` times an installed envguard (``~/.local/bin/envguard``) instead of this
checkout's source run as ``PY -m envguard``: an install made with ``--compile-bytecode``
(or by pip, which compiles by default) starts from bytecode even where
PYTHONDONTWRITEBYTECODE is set, as on this project's CI machines and in many images.

The command is a Python one-liner that prints the wall-clock time at which its first
statement runs; the lock is the bundled one and the environment checked is PY's.
Overhead before the child starts = median(child start − launch, gated) − the same,
direct (the child's own interpreter start cancels out). Also times ``envguard check``.
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


def to_child_start(cmd: list[str], env: dict[str, str], reps: int) -> list[float]:
    """Seconds from launching ``cmd`` to the first statement of the child it runs."""
    out = []
    for _ in range(reps):
        launched = time.time()
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT,
                              check=False)
        started = float(proc.stdout.strip().splitlines()[-1])
        out.append(started - launched)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--lock", default=str(ROOT / "lockfiles" / "dflash-train.toml"))
    parser.add_argument("--reps", type=int, default=11)
    parser.add_argument("--json", metavar="OUT")
    parser.add_argument("--envguard", metavar="CMD", help="an installed envguard to time")
    args = parser.parse_args()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    envguard = [args.python, "-m", "envguard"]
    if args.envguard:
        env.pop("PYTHONPATH")
        envguard = [args.envguard]
    child = [args.python, "-c", "import time; print(repr(time.time()))"]
    gated = [*envguard, "run", "--lock", args.lock, "--python", args.python, "--", *child]
    check = [*envguard, "check", "--lock", args.lock, "--python", args.python]
    for cmd in (gated, child, check):  # warm-up: bytecode, RECORD cache, page cache
        subprocess.run(cmd, capture_output=True, env=env, cwd=ROOT, check=False)
    t_gated, rc_gated = timed(gated, env, args.reps)
    t_child, _ = timed(child, env, args.reps)
    t_check, rc_check = timed(check, env, args.reps)
    starts_gated = to_child_start(gated, env, args.reps)
    starts_direct = to_child_start(child, env, args.reps)
    s_gated, s_direct = statistics.median(starts_gated), statistics.median(starts_direct)
    res = {
        "gated_s": statistics.median(t_gated), "direct_s": statistics.median(t_child),
        "check_s": statistics.median(t_check), "gate_exit": rc_gated, "check_exit": rc_check,
        "child_start_gated_s": s_gated, "child_start_direct_s": s_direct,
        "overhead_s": s_gated - s_direct,
        "overhead_min_s": min(starts_gated) - min(starts_direct),
        "host": platform.node(), "cpus": os.cpu_count(), "python": platform.python_version(),
        "bytecode": "written" if not os.environ.get("PYTHONDONTWRITEBYTECODE") else
                    "not written (PYTHONDONTWRITEBYTECODE)",
        "commands": {"gated": " ".join(gated), "direct": " ".join(child),
                     "check": " ".join(check)},
    }
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2) + "\n")
    print(f"{res['cpus']} CPUs, Python {res['python']}, bytecode {res['bytecode']}; "
          f"envguard: {' '.join(envguard)}; gate exit {rc_gated}, check exit {rc_check} "
          "(0 = the environment matched the lock)")
    print("| measure | median | bar |\n|---|---|---|")
    print(f"| `envguard run --lock L -- CHILD`, whole run | {res['gated_s']:.3f} s | |")
    print(f"| `CHILD` alone, whole run | {res['direct_s']:.3f} s | |")
    print(f"| launch → child's first statement, gated | {s_gated:.3f} s | |")
    print(f"| launch → child's first statement, direct | {s_direct:.3f} s | |")
    print(f"| gate overhead before the child starts | **{res['overhead_s']:.3f} s** "
          f"(fastest run {res['overhead_min_s']:.3f} s) | ≤ 0.3 s |")
    print(f"| `envguard check --lock L` | {res['check_s']:.3f} s | |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
