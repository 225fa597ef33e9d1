"""Launching dflash-train in real processes for the tests: one process, or torchrun on CPU
(gloo), with the small recipe the multi-process tests share."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import warnings
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


GLOO_TRANSPORT_FAILURES = ("Connection closed by peer", "Connection reset by peer",
                           "terminate called without an active exception")
"""How gloo's TCP transport fails on an overloaded 2-core machine, seen about once in three
full suite runs there (and never alone): a rank aborts in gloo's teardown, or its peer's
socket closes under it. A launch that fails this way is retried once (:func:`gloo_flake`)."""


def gloo_flake(proc: subprocess.CompletedProcess[str]) -> bool:
    """Failed, and only with one of :data:`GLOO_TRANSPORT_FAILURES` (not a dflash error)."""
    return proc.returncode != 0 and any(s in proc.stderr for s in GLOO_TRANSPORT_FAILURES)


def torchrun(n: int, *args: str, cwd: Path = REPO, timeout: float = 240,
             fresh: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``torchrun --standalone``; retried once after a gloo transport failure, with a
    warning that names it (a second failure is the test's to report). ``fresh``: the run
    folder of a run that starts from scratch, emptied before the retry."""
    argv = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(n),
            "--standalone", *args]
    proc = subprocess.run(argv, cwd=cwd, env=env(), capture_output=True, text=True,
                          timeout=timeout)
    if gloo_flake(proc):
        warnings.warn(f"torchrun retried after a gloo transport failure: "
                      f"{proc.stderr[-400:]!r}", stacklevel=2)
        if fresh is not None:
            shutil.rmtree(fresh, ignore_errors=True)
        proc = subprocess.run(argv, cwd=cwd, env=env(), capture_output=True, text=True,
                              timeout=timeout)
    return proc


def train_args(out: Path, steps: int, batch_size: int = 2) -> list[str]:
    """dflash-train's arguments for the small recipe, a checkpoint every 2 steps."""
    return ["--preset", "tiny", "--unguarded", "--quiet", "--out", str(out), f"--steps={steps}",
            f"--set=batch_size={batch_size}", "--set=save_every=2",
            *[a for a in SMALL if "save_every" not in a]]


def run(out: Path, n: int, steps: int, *extra: str) -> subprocess.CompletedProcess[str]:
    """The small recipe under torchrun with ``n`` processes, batch 2 per rank."""
    return torchrun(n, "-m", "dflash.cli.train", *train_args(out, steps), *extra,
                    fresh=None if "--resume" in extra else out)


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
