"""``envguard install`` of two checkouts against plain uv, alternating in one run.

    python benchmarks/ab_install.py --root DIR --old CHECKOUT [--reps 7] [--modes plain,old,new]
        [--uv-cache DIR] -- PACKAGE ARGS...

``--root`` is a folder ``bench_install.py --out`` made (its ``venv``, ``wheels`` and
``baseline.txt``). Each rep runs every mode once, in the order given, and syncs the venv back
to its baseline after each: ``plain`` is ``uv pip install ARGS``; ``new`` is ``envguard
install --yes -- uv pip install ARGS`` from this checkout; ``old`` the same from the checkout
``--old`` (a worktree of an older commit), with its own ``ENVGUARD_CACHE_DIR`` so the two
never read each other's memo files. Bytecode is on, as for a user. Prints each mode's median
and its times.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def uv() -> str:
    from uv import find_uv_bin

    return str(find_uv_bin())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", type=Path, required=True)
    parser.add_argument("--old", type=Path, help="a checkout of the code before")
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--modes", default="plain,old,new")
    parser.add_argument("--uv-cache", help="UV_CACHE_DIR (default: uv's own)")
    parser.add_argument("--pause", type=float, default=0.5, help="seconds between runs")
    parser.add_argument("install", nargs=argparse.REMAINDER, help="-- then uv's arguments")
    args = parser.parse_args()
    words = args.install[1:] if args.install[:1] == ["--"] else args.install
    modes = args.modes.split(",")
    if "old" in modes and args.old is None:
        parser.error("--old is needed for the old mode")
    python = str(args.root / "venv" / "bin" / "python")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("UV_", "PIP_"))
           and k not in ("VIRTUAL_ENV", "PYTHONDONTWRITEBYTECODE")}
    env.update(UV_OFFLINE="1", UV_NO_CONFIG="1", UV_PYTHON_DOWNLOADS="never")
    if args.uv_cache:
        env["UV_CACHE_DIR"] = args.uv_cache
    checkouts = {"new": (ROOT, args.root / "envguard-cache"),
                 "old": (args.old, args.root / "envguard-cache-old")}
    reset = [uv(), "pip", "sync", "--quiet", "--python", python, "--find-links",
             str(args.root / "wheels"), str(args.root / "baseline.txt")]

    def run(argv: list[str], extra: dict[str, str]) -> float:
        started = time.perf_counter()
        proc = subprocess.run(argv, env={**env, **extra}, capture_output=True, text=True,
                              cwd=args.root, check=False)
        took = time.perf_counter() - started
        if proc.returncode != 0:
            raise SystemExit(f"{argv} failed ({proc.returncode}):\n{proc.stdout}{proc.stderr}")
        return took

    times: dict[str, list[float]] = {m: [] for m in modes}
    for _ in range(args.reps):
        for mode in modes:
            if mode == "plain":
                took = run([uv(), "pip", "install", "--python", python, *words], {})
            else:
                checkout, cache = checkouts[mode]
                took = run([sys.executable, "-m", "envguard", "install", "--yes", "--python",
                            python, "--", uv(), "pip", "install", *words],
                           {"PYTHONPATH": str(checkout), "ENVGUARD_CACHE_DIR": str(cache)})
            times[mode].append(took)
            run(reset, {})
            time.sleep(args.pause)
    for mode, values in times.items():
        print(mode, "median", round(statistics.median(values), 3),
              [round(v, 3) for v in values])


if __name__ == "__main__":
    main()
