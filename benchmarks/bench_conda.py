"""A snapshot of a 300-package conda prefix against one of an equal-sized venv, in one run.

    python benchmarks/bench_conda.py [--packages 300] [--files 8] [--reps 11] [--out DIR]

Both are uv venvs (an interpreter to probe). The venv gets N tiny wheels from uv; the conda
prefix gets N tiny conda packages of the same files, installed by py-rattler from a local
channel (so conda-meta/ is written by a real installer). Each package holds ``--files``
files. The two ``envguard snapshot`` commands (default options: files checked by size)
alternate, ``--reps`` rounds; the medians and their ratio are printed.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.envguard.probe.test_conda_real import install, package  # noqa: E402
from tests.wheelfactory import build_wheel  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--packages", type=int, default=300)
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--reps", type=int, default=11)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    root = args.out or Path(tempfile.mkdtemp(prefix="bench-conda-"))
    root.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("UV_", "VIRTUAL_ENV"))}
    env.update({"UV_NO_CONFIG": "1", "UV_OFFLINE": "1", "UV_CACHE_DIR": str(root / "uv"),
                "ENVGUARD_CACHE_DIR": str(root / "envguard"), "NO_COLOR": "1"})
    wheels, channel = root / "wheels", root / "channel"
    names = [f"pkg{i:03d}" for i in range(args.packages)]
    for name in names:
        files = {f"{name}/f{j}.py": f"# {name} {j}\n" * 20 for j in range(args.files)}
        build_wheel(wheels, name, "1.0", files)
        package(channel, name, "1.0", "h0_0",
                {f"lib/{name}/f{j}.so": (f"{name} {j}\n" * 20).encode()
                 for j in range(args.files)})
    venv, prefix = root / "venv", root / "conda"
    for path in (venv, prefix):
        subprocess.run(["uv", "venv", "-q", "--python", os.path.realpath(sys.executable),
                        str(path)], env=env, check=True)
    subprocess.run(["uv", "pip", "install", "-q", "--python", str(venv / "bin" / "python"),
                    "--no-index", "--find-links", str(wheels), *names], env=env, check=True)
    install(prefix, channel, names, root / "rattler-cache")
    times: dict[str, list[float]] = {"venv": [], "conda": []}
    for _ in range(args.reps):
        for label, path in (("venv", venv), ("conda", prefix)):
            started = time.perf_counter()
            subprocess.run([sys.executable, "-m", "envguard", "snapshot", "-q", "--python",
                            str(path), "-o", str(root / f"{label}.json")], env=env, check=True)
            times[label].append(time.perf_counter() - started)
    v, c = statistics.median(times["venv"]), statistics.median(times["conda"])
    print(f"{args.packages} packages x {args.files} files, {args.reps} interleaved rounds")
    print(f"venv  ({args.packages} wheels):         median {v:.3f} s "
          f"(min {min(times['venv']):.3f})")
    print(f"conda ({args.packages} conda packages): median {c:.3f} s "
          f"(min {min(times['conda']):.3f})")
    print(f"ratio conda / venv: {c / v:.2f}")
    if not args.out:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
