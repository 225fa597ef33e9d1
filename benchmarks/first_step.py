"""Time to first step of ``dflash-train`` itself, and how fast a saved target loads.

``first_step`` launches the real command (``python -m dflash.cli.train``: the gate, the
imports, the target, the drafter, the data, the warm-up, the matmul peak) and times it
from launch to its first metrics line, then kills it (SIGKILL: a SIGTERM would write an
8B-sized checkpoint first). Each stderr line is timestamped as it arrives, so the start
phases the trainer prints are a timeline; ``metadata.json`` holds their seconds.

``load_speed`` saves a random target with ``save_pretrained``, drops the files from the
page cache (``posix_fadvise(DONTNEED)``, no root needed) and times a plain read of the
bytes against ``dflash.target.load_target`` of the folder, then both again from the
page cache.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def _reader(stream: Any, lines: list[tuple[float, str]], t0: float) -> None:
    for line in iter(stream.readline, ""):
        lines.append((round(time.time() - t0, 3), line.rstrip("\n")))


def first_step(preset: str, out: Path, env: dict[str, str], timeout: float,
               extra: tuple[str, ...] = (), keep_all: bool = False) -> dict[str, Any]:
    """One cold process of dflash-train, timed to its first logged step (``keep_all``: its
    whole stderr in ``stderr_all``, not only the last 40 lines)."""
    cmd = [sys.executable, "-m", "dflash.cli.train", "--preset", preset, "--unguarded",
           "--out", str(out), "--steps", "1000", "--set=log_every=1", "--set=save_every=0",
           "--set=eval_every=0", *extra]
    t0 = time.time()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    err: list[tuple[float, str]] = []
    std: list[tuple[float, str]] = []
    readers = [threading.Thread(target=_reader, args=(s, lines, t0), daemon=True)
               for s, lines in ((proc.stderr, err), (proc.stdout, std))]
    for r in readers:
        r.start()
    metrics = out / "metrics.jsonl"
    result: dict[str, Any] = {"command": " ".join(cmd[1:])}
    while True:
        if metrics.exists() and metrics.read_text().strip():
            result["first_step_s"] = time.time() - t0
            break
        if proc.poll() is not None or time.time() - t0 > timeout:
            result["error"] = (f"exit {proc.returncode}" if proc.returncode is not None
                               else f"no step after {timeout:.0f} s")
            break
        time.sleep(0.05)
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    proc.wait()
    for r in readers:
        r.join(5)
    if "first_step_s" in result:
        record = json.loads(metrics.read_text().splitlines()[0])
        result.update(since_start_s=record.get("since_start_s"), step_s=record.get("step_s"),
                      peak_mem_gb=record.get("peak_mem_gb"))
    meta = out / "metadata.json"
    if meta.exists():
        result["start_s"] = json.loads(meta.read_text()).get("start_s")
    result["stderr"] = err[-40:]
    if keep_all:
        result["stderr_all"] = err
    result["stdout"] = std[-10:]
    return result


def bytecode_state() -> dict[str, Any]:
    """Whether the children can use compiled bytecode (without it every process compiles
    torch and transformers from source, seconds of each start)."""
    import torch

    cached = list((Path(torch.__file__).parent / "__pycache__").glob("*.pyc"))
    return {"PYTHONDONTWRITEBYTECODE": os.environ.get("PYTHONDONTWRITEBYTECODE"),
            "PYTHONPYCACHEPREFIX": os.environ.get("PYTHONPYCACHEPREFIX"),
            "torch_pyc_files": len(cached)}


# -- safetensors load speed ------------------------------------------------------------------

def _evict(files: list[Path]) -> None:
    for f in files:
        fd = os.open(f, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _read_all(files: list[Path], chunk: int = 64 * 2**20) -> float:
    t0 = time.perf_counter()
    buf = bytearray(chunk)
    view = memoryview(buf)
    for f in files:
        with open(f, "rb", buffering=0) as fh:
            while fh.readinto(view):
                pass
    return time.perf_counter() - t0


def _sync(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def load_speed(preset: str, deadline: float, device_name: str = "cuda") -> dict[str, Any]:
    import torch

    from dflash.target import load_target

    device = torch.device(device_name)
    t0 = time.perf_counter()
    torch.empty(1, device=device)
    r: dict[str, Any] = {"preset": preset, "device_init_s": time.perf_counter() - t0}
    t0 = time.perf_counter()
    from transformers import AutoModelForCausalLM, Qwen3ForCausalLM  # noqa: F401 - timed apart

    r["import_transformers_s"] = time.perf_counter() - t0
    folder = Path(tempfile.mkdtemp(prefix="dflash-load-")) / "model"
    t0 = time.perf_counter()
    target = load_target(preset, device=device, dtype=torch.bfloat16)
    r["build_random_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    target.model.save_pretrained(folder)
    files = sorted(folder.glob("*.safetensors"))
    _evict(files)  # fsyncs first: the save is on disk, not only in the page cache
    r["save_s"] = time.perf_counter() - t0
    del target
    if device.type == "cuda":
        torch.cuda.empty_cache()
    gb = sum(f.stat().st_size for f in files) / 1e9
    r.update(files=len(files), gb=gb)
    for cache in ("cold", "warm"):
        if time.monotonic() > deadline:
            r[f"{cache}_skipped"] = "time"
            break
        if cache == "cold":
            _evict(files)
        seconds = _read_all(files)
        r[f"read_{cache}_s"], r[f"read_{cache}_gbs"] = seconds, gb / seconds
        if cache == "cold":
            _evict(files)
        # dflash's own Qwen3 loader, then transformers' from_pretrained (the files dropped
        # from the page cache again before it, for the cold row).
        for backend in ("dflash", "transformers"):
            if cache == "cold" and backend == "transformers":
                _evict(files)
            os.environ["DFLASH_TARGET_BACKEND"] = backend
            _sync(device)
            t0 = time.perf_counter()
            loaded = load_target(str(folder), device=device, dtype=torch.bfloat16)
            _sync(device)
            seconds = time.perf_counter() - t0
            r[f"load_{backend}_{cache}_s"], r[f"load_{backend}_{cache}_gbs"] = (
                seconds, gb / seconds)
            r[f"load_{backend}_class"] = type(loaded.model).__module__
            del loaded
            if device.type == "cuda":
                torch.cuda.empty_cache()
        os.environ.pop("DFLASH_TARGET_BACKEND", None)
        if cache == "warm" and device.type == "cuda":  # the floor: bytes straight to the GPU
            from safetensors.torch import load_file

            t0 = time.perf_counter()
            tensors = [load_file(str(f), device=str(device)) for f in files]
            _sync(device)
            r["safetensors_to_gpu_warm_s"] = time.perf_counter() - t0
            r["safetensors_to_gpu_warm_gbs"] = gb / r["safetensors_to_gpu_warm_s"]
            del tensors
            torch.cuda.empty_cache()
    for f in files:
        f.unlink()
    return r
