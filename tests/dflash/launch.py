"""Launching dflash-train in real processes for the tests: one process, or torchrun on CPU
(gloo), with the small recipe the multi-process tests share."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# The tiny preset cut down to what a multi-process test needs. peak_tflops is given so
# that no process spends half a second measuring a matmul peak nothing asserts on.
SMALL = ["--set=log_every=1", "--set=save_every=0", "--set=eval_every=0",
         "--set=synthetic_prompts=64", "--set=synthetic_response_tokens=40", "--set=held_out=4",
         "--set=buckets=64", "--set=anchors=8", "--set=lr=3e-3", "--set=peak_tflops=1"]
STEPS = 12
"""Steps of the shared two-rank run (``colocated_run`` in conftest) and the runs compared
with it: the same schedule, so their losses can be compared step by step."""


def env() -> dict[str, str]:
    """This environment for a child, the gate unverified, one thread per process (several
    processes share the cores; OpenMP threads spinning against each other cost more)."""
    out = {k: v for k, v in os.environ.items() if k != "ENVGUARD_VERIFIED"}
    out["OMP_NUM_THREADS"] = "1"
    return out


def torchrun(n: int, *args: str, cwd: Path = REPO, timeout: float = 240
             ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node",
                           str(n), "--standalone", *args], cwd=cwd, env=env(),
                          capture_output=True, text=True, timeout=timeout)


def train_args(out: Path, steps: int, batch_size: int = 2) -> list[str]:
    """dflash-train's arguments for the small recipe, a checkpoint every 2 steps."""
    return ["--preset", "tiny", "--unguarded", "--quiet", "--out", str(out), f"--steps={steps}",
            f"--set=batch_size={batch_size}", "--set=save_every=2",
            *[a for a in SMALL if "save_every" not in a]]


def run(out: Path, n: int, steps: int, *extra: str) -> subprocess.CompletedProcess[str]:
    """The small recipe under torchrun with ``n`` processes, batch 2 per rank."""
    return torchrun(n, "-m", "dflash.cli.train", *train_args(out, steps), *extra)


def single(out: Path, steps: int, *extra: str, batch_size: int = 2
           ) -> subprocess.CompletedProcess[str]:
    """The same recipe in one process without torchrun."""
    return subprocess.run([sys.executable, "-m", "dflash.cli.train",
                           *train_args(out, steps, batch_size), *extra],
                          cwd=REPO, env=env(), capture_output=True, text=True, timeout=240)


def losses(out: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in (out / "metrics.jsonl").read_text().splitlines()]


def guarded_race(root: Path, cache: str, *args: str) -> dict[str, object]:
    """``python -m dflash.compilation.race --mode guarded`` on CPU with its own, empty
    inductor and triton folders under ``root/cache``; its JSON line."""
    child = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(root / cache / "inductor"),
             "TRITON_CACHE_DIR": str(root / cache / "triton")}
    proc = subprocess.run(
        [sys.executable, "-m", "dflash.compilation.race", "--mode", "guarded", "--seq", "256",
         "--device", "cpu", "--timeout", "240", *args], cwd=REPO, env=child,
        capture_output=True, text=True, timeout=400, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]
    result: dict[str, object] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result
