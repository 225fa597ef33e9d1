"""Where a first launch's seconds go: the page cache, the bytecode, the data and the compile
folders, each made cold alone.

    python3 benchmarks/first_launch_parts.py --out $OUT [--preset qwen3-8b-shape]

Every run is ``dflash-train`` in a fresh process, timed to its first step
(:func:`first_step.first_step`), with its phases. In the order run:

- ``first``: everything new, on the machine as it came (its page cache too, when the
  machine is new): the first launch that issue 36 times;
- ``cold``: the dflash cache ``first`` left (bytecode, the generated data, the peak), new
  compile folders: the baseline every other run differs from in one thing;
- ``evicted``: as ``cold``, after dropping from the page cache every file of the Python
  that runs it (its standard library and site-packages: torch, the CUDA wheels, triton)
  with ``posix_fadvise(DONTNEED)``, which needs no root;
- ``no-bytecode``: as ``cold`` with a dflash cache that lacks only its bytecode folder,
  and the background compile off: the imports compile torch from source;
- ``no-bytecode-precompile``: the same with the background compile on (the default);
- ``no-data``: as ``cold`` with a dflash cache that lacks only the generated data;
- ``evicted-first``: ``first`` again after the eviction, with ``PYTHONPROFILEIMPORTTIME``
  (its stderr kept whole in ``evicted-first.stderr``).

Then ``generation.json``: the data phase alone (the target's greedy responses to the
recipe's prompts), its first and second call timed apart, and the CUDA time by kernel;
four processes, alternating the attention kernels generation may use (its default, and
with cuDNN's as well, which it used before).
Each result is written to ``--out`` as soon as it is measured.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from first_step import first_step

ROOT = Path(__file__).resolve().parents[1]


def write(out: Path, name: str, data: object) -> None:
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / f".{name}.json.tmp"
    tmp.write_text(json.dumps(data, indent=1, default=str))
    tmp.replace(out / f"{name}.json")


def evict_python() -> dict[str, Any]:
    """Drop every regular file under this Python's standard library and the site-packages
    that hold torch from the page cache."""
    spec = importlib.util.find_spec("torch")
    roots = {Path(sysconfig.get_paths()["stdlib"])}
    if spec is not None and spec.origin:
        roots.add(Path(spec.origin).parents[1])
    files = size = 0
    t0 = time.perf_counter()
    for root in sorted(roots):
        for folder, _dirs, names in os.walk(root):
            for name in names:
                path = os.path.join(folder, name)
                try:
                    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
                except OSError:
                    continue
                try:
                    st = os.fstat(fd)
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                    files += 1
                    size += st.st_size
                except OSError:
                    pass
                finally:
                    os.close(fd)
    return {"roots": [str(r) for r in sorted(roots)], "files": files,
            "gb": round(size / 2**30, 2), "seconds": round(time.perf_counter() - t0, 2)}


def env_for(base: Path, dflash_cache: Path, **extra: str) -> dict[str, str]:
    """Fresh compile folders under ``base``; the given dflash cache; envguard's cache kept
    beside it."""
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(base / "inductor"),
           "TRITON_CACHE_DIR": str(base / "triton"), "DFLASH_CACHE_DIR": str(dflash_cache),
           "ENVGUARD_CACHE_DIR": str(dflash_cache.parent / "envguard-cache"),
           "NCCL_NVLS_ENABLE": "0"}
    env.update(extra)
    return env


def copy_cache(src: Path, dst: Path, leave_out: str) -> None:
    if not src.is_dir():
        dst.mkdir(parents=True)
        return
    shutil.copytree(src, dst, symlinks=True, ignore=lambda d, names: (
        [leave_out] if Path(d) == src and leave_out in names else []))


EXTRA: list[str] = []
"""``--extra`` arguments for every launch (a smaller recipe for a try on the CPU)."""


def launch(out: Path, results: dict[str, Any], name: str, preset: str, env: dict[str, str],
           base: Path, timeout: float) -> None:
    t0 = time.perf_counter()
    r = first_step(preset, base / f"run-{name}", env, timeout,
                   (f"--set=mega_cache={base / f'store-{name}'}", *EXTRA))
    r["wall_s"] = round(time.perf_counter() - t0, 2)
    results[name] = r
    write(out, "runs", results)
    print(name, r.get("first_step_s"), r.get("start_s"), flush=True)


GENERATION = r"""
import json, sys, time
import torch
from dflash.presets import PRESETS
from dflash.startup import generation_batch, synthetic_examples
from dflash.target import load_target
cfg = PRESETS[sys.argv[1]]()
if sys.argv[2] == "cudnn":  # the kernels before generation excluded cuDNN's
    from torch.nn.attention import SDPBackend
    from dflash.decoding import generate
    generate.GENERATION_BACKENDS = [SDPBackend.CUDNN_ATTENTION, *generate.GENERATION_BACKENDS]
t0 = time.perf_counter()
target = load_target(cfg.target, device="cuda", dtype=torch.bfloat16, layer_ids=cfg.layer_ids,
                     seed=cfg.seed)
torch.cuda.synchronize()
r = {"kernels": sys.argv[2], "load_s": time.perf_counter() - t0,
     "batch": generation_batch(target, cfg),
     "prompts": cfg.synthetic_prompts, "tokens": cfg.synthetic_response_tokens}
for name in ("first_s", "second_s"):
    t0 = time.perf_counter()
    synthetic_examples(target, cfg)
    torch.cuda.synchronize()
    r[name] = time.perf_counter() - t0
from torch.profiler import ProfilerActivity, profile
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
    t0 = time.perf_counter()
    synthetic_examples(target, cfg)
    torch.cuda.synchronize()
    r["profiled_s"] = time.perf_counter() - t0
rows = []
for e in prof.key_averages():
    rows.append({"name": e.key[:90], "calls": e.count,
                 "cuda_ms": round(getattr(e, "device_time_total", 0) / 1e3, 2),
                 "cpu_ms": round(e.cpu_time_total / 1e3, 2)})
r["by_cuda"] = sorted(rows, key=lambda x: -x["cuda_ms"])[:25]
r["by_cpu"] = sorted(rows, key=lambda x: -x["cpu_ms"])[:25]
print(json.dumps(r))
"""


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--preset", default="qwen3-8b-shape")
    p.add_argument("--skip", default="", help="comma-separated runs to leave out")
    p.add_argument("--extra", action="append", default=[], help="an argument for every launch")
    args = p.parse_args()
    EXTRA.extend(args.extra)
    skip = set(filter(None, args.skip.split(",")))
    base = Path(tempfile.mkdtemp(prefix="dflash-parts-"))
    results: dict[str, Any] = {"preset": args.preset, "python": sys.version}
    first_cache = base / "caches" / "first" / "dflash-cache"
    first_cache.parent.mkdir(parents=True)
    if "first" in skip:  # the others compare with it: only the generation is left
        skip |= {"cold", "evicted", "no-bytecode", "no-bytecode-precompile", "no-data",
                 "evicted-first"}
    else:
        launch(args.out, results, "first", args.preset,
               env_for(base / "c-first", first_cache), base, 150)
    plan: list[tuple[str, Any]] = [
        ("cold", lambda: (first_cache, {})),
        ("evicted", lambda: (first_cache, {"_evict": "1"})),
        ("no-bytecode", lambda: (_without(first_cache, base, "no-bytecode", "bytecode"),
                                 {"DFLASH_NO_PRECOMPILE": "1"})),
        ("no-bytecode-precompile", lambda: (
            _without(first_cache, base, "no-bytecode-precompile", "bytecode"), {})),
        ("no-data", lambda: (_without(first_cache, base, "no-data", "synthetic"), {})),
    ]
    for name, make in plan:
        if name in skip:
            continue
        cache, extra = make()
        if extra.pop("_evict", None):
            results[f"{name}-eviction"] = evict_python()
        launch(args.out, results, name, args.preset, env_for(base / f"c-{name}", cache,
                                                              **extra), base, 120)
    if "evicted-first" not in skip:
        results["evicted-first-eviction"] = evict_python()
        cache = base / "caches" / "evicted-first" / "dflash-cache"
        cache.parent.mkdir(parents=True)
        env = env_for(base / "c-evicted-first", cache, PYTHONPROFILEIMPORTTIME="1")
        r = first_step(args.preset, base / "run-evicted-first", env, 150,
                       (f"--set=mega_cache={base / 'store-evicted-first'}", *EXTRA),
                       keep_all=True)
        lines = r.pop("stderr_all", [])
        (args.out / "evicted-first.stderr").write_text(
            "".join(f"{t}\t{line}\n" for t, line in lines))
        r["stderr"] = [x for x in lines if "import time:" not in x[1]][-40:]
        results["evicted-first"] = r
        write(args.out, "runs", results)
        print("evicted-first", r.get("first_step_s"), r.get("start_s"), flush=True)
    if "generation" not in skip:
        runs = []
        for kernels in ("default", "cudnn", "default", "cudnn"):
            proc = subprocess.run([sys.executable, "-c", GENERATION, args.preset, kernels],
                                  cwd=ROOT, env=env_for(base / "c-gen", first_cache),
                                  capture_output=True, text=True, timeout=240, check=False)
            lines = proc.stdout.strip().splitlines()
            runs.append(json.loads(lines[-1]) if proc.returncode == 0 and lines
                        else {"kernels": kernels, "exit": proc.returncode,
                              "stderr": proc.stderr[-3000:]})
            write(args.out, "generation", runs)
    return 0


def _without(src: Path, base: Path, name: str, leave_out: str) -> Path:
    dst = base / "caches" / name / "dflash-cache"
    dst.parent.mkdir(parents=True)
    copy_cache(src, dst, leave_out)
    return dst


if __name__ == "__main__":
    raise SystemExit(main())
