"""What ``envguard install`` costs against the installer alone, and what ``undo`` costs.

    python benchmarks/bench_install.py [--out DIR] [--reps 5] [--tiny 40]

A venv of about 100 packages: this checkout's own development set (``uv pip freeze`` of
``.venv``, envguard itself and torch left out; installed offline from uv's warm cache, uv's default
link mode) plus ``--tiny`` generated wheels. Three installs: one more generated wheel
that requires two of them (``--find-links``), ``flask botocore aiohttp`` (15 wheels
from uv's warm cache, offline) and ``diffusers openai pandas scipy sqlalchemy`` (23 wheels,
numpy replaced by another version: an inference stack's kind of change). In one run,
alternating, ``--reps`` times each:

- ``uv pip install ...`` alone, then ``uv pip sync`` back to the venv's set (untimed);
  both runs name the same uv binary (``uv`` on PATH may be a slower wrapper, such as a
  pyenv shim, which would charge envguard for the wrapper's start);
- ``envguard install --yes -- uv pip install ...`` (predicted on a scratch copy, made,
  checked, recorded; ``--yes`` because the offline resolution of the third set picks old
  releases that envguard rightly refuses: pandas 1.5.3 with numpy 2 and SQLAlchemy 2), then
  the same sync back;
- ``envguard undo`` of one package's change: ``tiny-05`` replaced by another build of the
  same version (``envguard install --yes``, untimed), then undone (timed).

``UV_CACHE_DIR`` is kept: with it and ``--out`` on a tmpfs (``/dev/shm``), the venv, the
scratch copy and uv's cache are in memory, and the run measures the tools, not the disk
(this VM's disk made a folder's first ``mkdir`` calls cost 10-20 times more, at random).

With ``--from-venv`` a venv holding torch (README's CUDA one) also times a reinstall of
torch itself. Prints the medians, the ratio, and the copy's numbers from envguard's JSON
(files linked, files copied, seconds per phase).
"""

from __future__ import annotations

import argparse
import json
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

from tests.wheelfactory import build_wheel  # noqa: E402


def uv() -> str:
    from uv import find_uv_bin

    return str(find_uv_bin())


def run(args: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    proc = subprocess.run(args, env=env, capture_output=True, text=True, check=False)
    took = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"{args} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return took


def mkdir_us(folder: Path, n: int = 100) -> float:
    """Microseconds per ``mkdir`` in ``folder`` (then removed): the disk's state, printed
    with the results. On this project's VM one folder's new entries cost 30 µs and another's
    500-700 µs on the same disk, which moves uv's own time as much as envguard's."""
    probe = folder / ".mkdir-probe"
    shutil.rmtree(probe, ignore_errors=True)
    probe.mkdir()
    started = time.perf_counter()
    for i in range(n):
        (probe / str(i)).mkdir()
    took = time.perf_counter() - started
    shutil.rmtree(probe)
    return took / n * 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--tiny", type=int, default=40)
    parser.add_argument("--from-venv", type=Path, default=ROOT / ".venv",
                        help="the venv whose set is rebuilt (default: this checkout's .venv, "
                             "torch left out); give the CUDA-torch venv README builds to "
                             "measure that one, torch included (uv's cache must hold it)")
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="bench-install-"))
    out.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items()
           if (not k.startswith(("UV_", "PIP_")) or k == "UV_CACHE_DIR")
           and k not in ("VIRTUAL_ENV",)}
    env.update({"UV_OFFLINE": "1", "UV_NO_CONFIG": "1", "UV_PYTHON_DOWNLOADS": "never",
                "ENVGUARD_CACHE_DIR": str(out / "envguard-cache")})
    wheels, rebuilt = out / "wheels", out / "rebuilt"
    for i in range(args.tiny):
        build_wheel(wheels, f"tiny-{i:02d}", "1.0",
                    {f"tiny_{i:02d}/__init__.py": f"N = {i}\n",
                     f"tiny_{i:02d}/data.bin": os.urandom(20000)})
    build_wheel(rebuilt, "tiny-05", "1.0", {"tiny_05/__init__.py": "N = 'rebuilt'\n",
                                            "tiny_05/data.bin": os.urandom(20000)})
    build_wheel(wheels, "x-pkg", "1.0", {"x_pkg/__init__.py": ""},
                requires=("tiny-01", "tiny-02"))
    own = args.from_venv.resolve() == (ROOT / ".venv").resolve()
    freeze = subprocess.run([uv(), "pip", "freeze", "--python",
                             str(args.from_venv / "bin" / "python")],
                            capture_output=True, text=True, check=True).stdout.splitlines()
    # this checkout's CPU torch came from a local folder (README), not from a cache index:
    # left out there; a venv built from PyPI (README's CUDA one) keeps it
    skip = ("-e", "torch==") if own else ("-e", "envguard")
    reqs = [line for line in freeze if line and not line.startswith(skip)]
    venv = out / "venv"
    python = str(venv / "bin" / "python")
    if not venv.exists():
        run([uv(), "venv", "--quiet", "--python", os.path.realpath(sys.executable), str(venv)],
            env)
        # another venv's set may need index pages uv's cache lacks (the wheels are there)
        build_env = env if own else {k: v for k, v in env.items() if k != "UV_OFFLINE"}
        run([uv(), "pip", "install", "--quiet", "--python", python, *reqs], build_env)
        run([uv(), "pip", "install", "--quiet", "--python", python, "--no-index",
             "--find-links", str(wheels), *(f"tiny-{i:02d}" for i in range(args.tiny))], env)
    count = len(subprocess.run([uv(), "pip", "freeze", "--python", python], env=env,
                               capture_output=True, text=True, check=True).stdout.split())
    baseline = out / "baseline.txt"
    baseline.write_text(subprocess.run([uv(), "pip", "freeze", "--python", python], env=env,
                                       capture_output=True, text=True, check=True).stdout)
    reset = [uv(), "pip", "sync", "--quiet", "--python", python, "--find-links", str(wheels),
             str(baseline)]
    envguard = [sys.executable, "-m", "envguard"]
    cases = {
        "x-pkg (1 tiny wheel, --find-links)": ["pip", "install", "--no-index",
                                               "--find-links", str(wheels), "x-pkg"],
        "flask botocore aiohttp (15 wheels, uv's cache)": ["pip", "install", "flask",
                                                           "botocore", "aiohttp"],
        # an inference stack's kind: 23 wheels, thousands of files, numpy replaced
        "diffusers openai pandas scipy sqlalchemy (23 wheels, numpy replaced)": [
            "pip", "install", "diffusers", "openai", "pandas", "scipy", "sqlalchemy"],
    }
    if not own and any(r.startswith("torch==") for r in reqs):
        # the incident's kind of change, where the installer's own time is the most:
        # torch's thousands of files replaced (its same build again, from uv's cache)
        cases["torch reinstalled (uv's cache)"] = ["pip", "install", "--reinstall-package",
                                                   "torch", "torch"]
    site = next(venv.glob("lib/python3*/site-packages"))
    print(f"mkdir: {mkdir_us(site):.0f} µs in the venv's site-packages, "
          f"{mkdir_us(out):.0f} µs beside it (where the copy is kept)")
    for label, install in cases.items():
        plain, guarded = [], []
        for _ in range(args.reps):
            plain.append(run([uv(), *install[:2], "--python", python, *install[2:]], env))
            run(reset, env)
            guarded.append(run([*envguard, "install", "--yes", "--python", python, "--", uv(),
                                *install], env))
            run(reset, env)
        costs = json.loads(subprocess.run(
            [*envguard, "install", "--dry-run", "--format", "json", "--python", python, "--",
             uv(), *install], env=env, capture_output=True, text=True,
            check=False).stdout)["costs"]
        p, g = statistics.median(plain), statistics.median(guarded)
        print(f"{label}:")
        print(f"  plain uv pip install:      median {p:.2f} s  {[round(x, 2) for x in plain]}")
        print(f"  envguard install -- uv ...: median {g:.2f} s  {[round(x, 2) for x in guarded]}")
        print(f"  ratio {g / p:.1f}x, envguard's added time {g - p:.2f} s; the prediction: "
              f"{costs}")
    undo = []
    for _ in range(args.reps):
        subprocess.run([*envguard, "install", "--yes", "--python", python, "--", uv(), "pip",
                        "install", "--no-index", "--find-links", str(rebuilt), "--reinstall",
                        "tiny-05"], env=env, capture_output=True, check=True)
        undo.append(run([*envguard, "undo", "--python", python], env))
    u = statistics.median(undo)
    print(f"venv: {count} packages ({venv})")
    print(f"envguard undo (one package's rebuild): median {u:.2f} s  "
          f"{[round(x, 2) for x in undo]}")
    if args.out is None:
        shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()
