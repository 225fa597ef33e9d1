"""``envguard bisect`` on the incident's change set, on fake wheels, offline, timed.

    python benchmarks/bench_bisect.py [--out DIR] [--unchanged 78] [--reps 3] [--pip-reps 1] [-j 1]

Builds tiny wheels shaped like the incident (docs/INCIDENT.md): 78 packages that stay, and
40 changes: torch 2.11.0+cu130 rebuilt from another commit (its FX tracing flag made
global: the race), four cu12 NVIDIA wheels swapped for cu13 ones, SGLang, flashinfer,
tilelang and ten of their dependencies installed, and seventeen upgrades. GOOD and BAD are
real venvs and real snapshots; the command is a three-thread check of the tracing flag.

Prints the text report (docs/BISECT.md shows it), then the timings: the whole bisection,
each trial's build (``uv venv`` + ``uv pip sync`` of a 100-package set, warm uv cache) and
run, and, for comparison in the same run, one trial built the way one would by hand
without uv (``python -m venv`` + ``pip install --no-index --find-links``, same set).
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

from tests.wheelfactory import build_wheel, fake_torch_files  # noqa: E402

GOOD_GIT = "e2b8a1c7f0d94c3b8a5f6e7d8c9b0a1f2e3d4c5b"
BAD_GIT = "70d99e998b4955e0049d13a98d77ae1b14db1f45"

THREAD_LOCAL = """import threading
_state = threading.local()


def is_fx_tracing():
    return getattr(_state, "tracing", False)


def set_tracing(flag):
    _state.tracing = flag
"""
GLOBAL_FLAG = """_is_fx_tracing_flag = False


def is_fx_tracing():
    return _is_fx_tracing_flag


def set_tracing(flag):
    global _is_fx_tracing_flag
    _is_fx_tracing_flag = flag
"""
CHECK = """import threading, sys
from torch.fx import _symbolic_trace as st
inside, checked = threading.Barrier(3), threading.Barrier(3)
seen = []
def compile_one(tracer):
    if tracer:
        st.set_tracing(True)
    inside.wait()
    if not tracer:
        seen.append(st.is_fx_tracing())
    checked.wait()
    if tracer:
        st.set_tracing(False)
threads = [threading.Thread(target=compile_one, args=(i == 0,)) for i in range(3)]
for t in threads: t.start()
for t in threads: t.join()
if any(seen):
    sys.exit("is_fx_tracing() is True in a thread that is not tracing: the FX flag is shared")
print("three cold compiles, no cross-thread tracing flag")
"""
CU12 = ["nvidia-cublas-cu12", "nvidia-cuda-runtime-cu12", "nvidia-cudnn-cu12",
        "nvidia-nccl-cu12"]
INSTALLED = ["sglang", "flashinfer-python", "tilelang", "sgl-kernel", "orjson", "uvloop",
             "pyzmq", "outlines-core", "xgrammar", "partial-json-parser", "llguidance",
             "compressed-tensors", "msgspec", "blake3"]
UPGRADED = ["transformers", "tokenizers", "safetensors", "huggingface-hub", "numpy",
            "triton-kernels", "accelerate", "datasets", "pyarrow", "fsspec", "aiohttp",
            "pydantic", "pydantic-core", "typing-extensions", "jinja2", "filelock",
            "requests"]


def make_world(root: Path, unchanged: int) -> tuple[Path, list[str], list[str]]:
    wheels = root / "wheels"
    good_torch, bad_torch = root / "torch-good", root / "torch-bad"
    for folder, git, flag in ((good_torch, GOOD_GIT, THREAD_LOCAL),
                              (bad_torch, BAD_GIT, GLOBAL_FLAG)):
        files = fake_torch_files(version="2.11.0+cu130", git_version=git, cuda="13.0")
        files["torch/fx/__init__.py"] = ""
        files["torch/fx/_symbolic_trace.py"] = flag
        build_wheel(folder, "torch", "2.11.0+cu130", files)
    good = ["torch==2.11.0+cu130"]
    bad = ["torch==2.11.0+cu130"]
    for i in range(unchanged):
        name = f"stays{i:02d}"
        build_wheel(wheels, name, "1.0", {f"{name.replace('-', '_')}/__init__.py": ""})
        good.append(f"{name}==1.0")
        bad.append(f"{name}==1.0")
    for name in CU12:
        build_wheel(wheels, name, "12.8.0", {f"{name.replace('-', '_')}/__init__.py": ""})
        cu13 = name.replace("-cu12", "-cu13")
        build_wheel(wheels, cu13, "13.0.0", {f"{cu13.replace('-', '_')}/__init__.py": ""})
        good.append(f"{name}==12.8.0")
        bad.append(f"{cu13}==13.0.0")
    for name in INSTALLED:
        build_wheel(wheels, name, "0.5.2", {f"{name.replace('-', '_')}/__init__.py": ""})
        bad.append(f"{name}==0.5.2")
    for name in UPGRADED:
        for version in ("1.0", "2.0"):
            build_wheel(wheels, name, version, {f"{name.replace('-', '_')}/__init__.py": ""})
        good.append(f"{name}==1.0")
        bad.append(f"{name}==2.0")
    return wheels, good, bad


def sh(args: list[str], env: dict[str, str]) -> None:
    subprocess.run(args, env=env, check=True, capture_output=True, text=True)


def venv(root: Path, name: str, reqs: list[str], links: list[Path], env: dict[str, str]
         ) -> Path:
    path = root / name
    sh(["uv", "venv", "--quiet", "--python", os.path.realpath(sys.executable), str(path)], env)
    args = ["uv", "pip", "install", "--quiet", "--python", str(path / "bin" / "python"),
            "--no-index"]
    for link in links:
        args += ["--find-links", str(link)]
    sh([*args, *reqs], env)
    return path


def snapshot(path: Path, out: Path, env: dict[str, str]) -> None:
    sh([sys.executable, "-m", "envguard", "snapshot", "-q", "--verify", "none", "--python",
        str(path / "bin" / "python"), "-o", str(out)], env)


def pip_trial(root: Path, reqs: list[str], links: list[Path], env: dict[str, str]) -> float:
    """One trial built without uv: ``python -m venv`` (with pip) + ``pip install``."""
    target = root / "pip-trial"
    shutil.rmtree(target, ignore_errors=True)
    started = time.perf_counter()
    sh([os.path.realpath(sys.executable), "-m", "venv", str(target)], env)
    args = [str(target / "bin" / "python"), "-m", "pip", "install", "--quiet", "--no-index",
            "--disable-pip-version-check"]
    for link in links:
        args += ["--find-links", str(link)]
    sh([*args, *reqs], env)
    return time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="keep the world here (default: a temp dir)")
    parser.add_argument("--unchanged", type=int, default=78)
    parser.add_argument("--pip-reps", type=int, default=1)
    parser.add_argument("--reps", type=int, default=3, help="bisections timed")
    parser.add_argument("-j", "--jobs", type=int, default=1)
    args = parser.parse_args()
    root = args.out or Path(tempfile.mkdtemp(prefix="bench-bisect-"))
    root.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("UV_", "PIP_"))}
    env.update({"UV_NO_CONFIG": "1", "UV_OFFLINE": "1", "UV_PYTHON_DOWNLOADS": "never",
                "UV_CACHE_DIR": str(root / "uv-cache"), "PIP_NO_INDEX": "1",
                "PIP_CONFIG_FILE": os.devnull, "ENVGUARD_CACHE_DIR": str(root / "envguard"),
                "PYTHONPATH": str(ROOT), "NO_COLOR": "1", "COLUMNS": "100"})
    wheels, good_reqs, bad_reqs = make_world(root, args.unchanged)
    links = [wheels, root / "torch-good", root / "torch-bad"]
    good = venv(root, "good", good_reqs, [wheels, root / "torch-good"], env)
    bad = venv(root, "bad", bad_reqs, [wheels, root / "torch-bad"], env)
    snapshot(good, root / "good.json", env)
    snapshot(bad, root / "bad.json", env)
    (root / "check_fx_race.py").write_text(CHECK)
    base = [sys.executable, "-m", "envguard", "bisect", "good.json", "bad.json", "--no-index",
            "--offline", "-j", str(args.jobs)]
    for link in links:
        base += ["--find-links", str(link)]
    cmd = ["--", "python", "check_fx_race.py"]
    text = subprocess.run([*base, *cmd], env=env, cwd=root, capture_output=True, text=True)
    print(f"$ envguard bisect good.json bad.json --find-links wheels/ ... -- python "
          f"check_fx_race.py   (exit {text.returncode})")
    print(text.stdout)
    totals: list[float] = []
    builds: list[float] = []
    runs: list[float] = []
    for _ in range(args.reps):
        started = time.perf_counter()
        proc = subprocess.run([*base, "--format", "json", *cmd], env=env, cwd=root,
                              capture_output=True, text=True)
        totals.append(time.perf_counter() - started)
        doc = json.loads(proc.stdout)
        trials = doc["trials"]
        builds += [t["build_seconds"] for t in trials]
        runs += [t["run_seconds"] for t in trials]
    total = statistics.median(totals)
    pip = [pip_trial(root, good_reqs, [wheels, root / "torch-good"], env)
           for _ in range(args.pip_reps)]
    print(f"changes: {len(doc['changes'])}, packages per trial: {len(good_reqs)}, "
          f"trials: {len(trials)}, verdict: {doc['verdict']}, exit {proc.returncode}")
    print(f"whole bisection (wall, envguard's own start included), median of {args.reps}: "
          f"{total:.2f} s  (min {min(totals):.2f}, max {max(totals):.2f})")
    print(f"trial build (uv venv + uv pip sync + uv pip check), median: "
          f"{statistics.median(builds):.3f} s  (min {min(builds):.3f}, max {max(builds):.3f})")
    print(f"trial command run, median: {statistics.median(runs):.3f} s")
    print(f"the same set by hand without uv (python -m venv + pip install), median of "
          f"{len(pip)}: {statistics.median(pip):.2f} s  → ratio uv trial / pip trial: "
          f"{statistics.median(builds) / statistics.median(pip):.3f}")
    if not args.out:
        shutil.rmtree(root, ignore_errors=True)
    return 0 if proc.returncode == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
