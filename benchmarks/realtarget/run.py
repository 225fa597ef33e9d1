"""The run of ``benchmarks/real_target.py``: its sizes, the state its stages share, and
the helpers every stage uses (logging, atomic writes, running a project command)."""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

STARTED = time.monotonic()
ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

EOS = "<|endoftext|>"
SPLIT_SALT = "real-target-split-v1:"
ORDER_SALT = "real-target-order-v1:"
PROMPT_SALT = "real-target-prompt-v1:"
BPE_SALT = "real-target-bpe-v1:"
PRUNED_DIRS = {"__pycache__", "site-packages", "dist-packages"}
"""Never walked into: caches, and the package folders of another interpreter inside a
root (a base interpreter's site-packages under its stdlib); package roots are their own
roots."""
DENSE_BF16_TFLOPS = {"H100": 989.4, "H200": 989.4}
"""Datasheet dense bf16 of the SXM parts; the MFU denominator unless --peak-tflops."""



# -- sizes ------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Size:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    """BPE vocabulary (with the EOS token); the embedding is padded past it."""
    seq_len: int
    micro_batch: int
    accum: int
    lr: float
    tokenizer_mb: float
    """Training text the BPE learns from."""
    max_corpus_mb: float | None
    eval_tokens: int
    prompt_tokens: int
    train_prompts: int
    eval_prompts: int
    sample_tokens: int
    """New tokens of the greedy continuations of the eval prompts."""
    eval_every_s: float
    log_every: int


SIZES: dict[str, Size] = {
    # 8 layers so that dflash's default 5 tapped layers exist; seconds on a laptop CPU.
    "tiny": Size(hidden=64, layers=8, heads=4, kv_heads=2, head_dim=16, intermediate=192,
                 vocab=1024, seq_len=128, micro_batch=8, accum=1, lr=3e-3, tokenizer_mb=2,
                 max_corpus_mb=4, eval_tokens=16_384, prompt_tokens=32, train_prompts=64,
                 eval_prompts=16, sample_tokens=16, eval_every_s=5, log_every=10),
    # ~95 M parameters (tied embeddings): GPT-2-small-like, GQA 12/4.
    "small": Size(hidden=768, layers=12, heads=12, kv_heads=4, head_dim=64,
                  intermediate=2048, vocab=16_000, seq_len=1024, micro_batch=64, accum=2,
                  lr=1.5e-3, tokenizer_mb=48, max_corpus_mb=512, eval_tokens=2**21,
                  prompt_tokens=256, train_prompts=16384, eval_prompts=256, sample_tokens=64,
                  eval_every_s=30, log_every=20),
    # ~270 M parameters.
    "base": Size(hidden=1024, layers=20, heads=16, kv_heads=8, head_dim=64,
                 intermediate=2816, vocab=32_000, seq_len=1024, micro_batch=32, accum=8,
                 lr=1e-3, tokenizer_mb=64, max_corpus_mb=1024, eval_tokens=2**21,
                 prompt_tokens=256, train_prompts=8192, eval_prompts=256, sample_tokens=64,
                 eval_every_s=60, log_every=10),
}


# -- the run and its stages -------------------------------------------------------------------
@dataclass
class Run:
    args: argparse.Namespace
    size: Size
    out: Path
    """The stage results (small JSON files)."""
    work: Path
    """The bulky artifacts: tokens, the target folder, prompt sets."""
    device: torch.device
    memo: dict[str, Any] = field(default_factory=dict)
    """Objects the stages of one process share instead of re-reading them."""

    def result(self, stage: str) -> dict[str, Any]:
        """The result of an earlier stage, of this process or an earlier one (OUT, else
        WORK/results, where every result is kept too)."""
        for path in (self.out / f"{stage}.json", self.results / f"{stage}.json"):
            if path.exists():
                data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
                return data
        raise SystemExit(f"real_target: stage {stage!r} has not run in {self.out} "
                         f"or {self.results}")

    def has_result(self, stage: str) -> bool:
        return any((d / f"{stage}.json").exists() for d in (self.out, self.results))

    @property
    def results(self) -> Path:
        return self.work / "results"

    def save_result(self, stage: str, data: dict[str, Any]) -> None:
        write_json_atomic(self.out / f"{stage}.json", data)
        write_json_atomic(self.results / f"{stage}.json", data)

    def seconds_left(self) -> float:
        """Seconds to ``--deadline-s`` (counted from the script's start); inf without."""
        if self.args.deadline_s is None:
            return math.inf
        return float(self.args.deadline_s - (time.monotonic() - STARTED))

    @property
    def target_dir(self) -> Path:
        return self.work / "target"

    @property
    def compute_dtype(self) -> torch.dtype:
        return torch.bfloat16 if self.device.type == "cuda" else torch.float32


@dataclass(frozen=True, slots=True)
class Stage:
    name: str
    run: Callable[[Run], dict[str, Any]]


def log(stage: str, message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {stage}: {message}", flush=True)


def write_json_atomic(path: Path, data: Any, *, indent: int | None = 1) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=indent, default=str, allow_nan=False)
        fh.write("\n")
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def write_jsonl_atomic(path: Path, rows: Iterable[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row, allow_nan=False) + "\n")
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def run_cli(run: Run, name: str, argv: Sequence[str], *, timeout: float | None = None,
            echo: bool = False, grace_s: float = 60.0) -> dict[str, Any]:
    """Run a command for a pipeline stage, e.g. ``[sys.executable, "-m",
    "dflash.cli.evaluate", "--drafter", ..., "--json"]``, from the repository root.

    stderr (the commands' progress) passes through live; stdout is collected (and echoed
    with ``echo``) and written to ``WORK/<name>.log``. After ``timeout`` seconds the
    command gets SIGTERM (dflash-train then checkpoints and exits), after ``grace_s``
    more SIGKILL. Returns rc, seconds, the command, whether it was stopped, the output's
    tail, and the parsed JSON when stdout is one JSON document."""
    import signal
    import threading

    logfile = run.work / f"{name}.log"
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    log(name, " ".join(argv))
    t0 = time.perf_counter()
    proc = subprocess.Popen(list(argv), cwd=ROOT, stdout=subprocess.PIPE, text=True, env=env)
    stopped: list[str] = []

    def stop() -> None:
        if proc.poll() is None:
            stopped.append("SIGTERM")
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                stopped.append("SIGKILL")
                proc.kill()

    timer = threading.Timer(timeout, stop) if timeout is not None else None
    if timer is not None:
        timer.daemon = True
        timer.start()
    lines: list[str] = []
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line)
        if echo:
            print(f"  {name}| {line}", end="", flush=True)
    rc = proc.wait()
    if timer is not None:
        timer.cancel()
    out = "".join(lines)
    logfile.write_text(out, encoding="utf-8")
    result: dict[str, Any] = {"argv": list(argv), "rc": rc,
                              "seconds": time.perf_counter() - t0, "log": str(logfile),
                              "stopped": stopped, "tail": out[-3000:]}
    with contextlib.suppress(ValueError):
        result["json"] = json.loads(out)
        result["tail"] = ""
    log(name, f"rc {rc} in {result['seconds']:.1f} s" + (f" (stopped: {stopped})"
                                                           if stopped else ""))
    return result


def unit_hash(salt: str, text: str) -> float:
    """A deterministic number in [0, 1) for ``text``, the same on every machine."""
    digest = hashlib.sha256((salt + text).encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


