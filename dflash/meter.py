"""Measuring a run: the device clock, the matmul ceiling that MFU divides by, step metrics
summed on the device between two log points and turned into one metrics.jsonl record
(reduced over ranks under torchrun) at each log point, and the metrics.jsonl writer.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from dflash.distributed.world import World, all_reduce_sum
from dflash.errors import InputError, RunError
from dflash.flops import FlopModel
from dflash.loss import LossOutput
from dflash.ticks import Values
from envguard.atomic import write_text_atomic
from envguard.errors import EnvguardError
from envguard.input_file import NotReadable, read_bounded, read_bounded_text


def sync_device(device: torch.device) -> None:
    """Wait for the device (CUDA) before reading a clock; a no-op on CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def sync_stream(device: torch.device) -> None:
    """Wait for what this thread queued on the device (CUDA: its current stream), not for
    another thread's own stream; a no-op on CPU. The start's phases time their own work
    this way while the synthetic data's loop runs beside them on its stream."""
    if device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()


def measure_matmul_tflops(device: torch.device, dtype: torch.dtype, size: int | None = None,
                          seconds: float = 0.5) -> float:
    """The achieved dense matmul rate on this device, the MFU denominator."""
    n = size or (8192 if device.type == "cuda" else 512)
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    for _ in range(3):
        a @ b
    sync_device(device)
    iters, start = 0, time.perf_counter()
    while True:
        for _ in range(10):
            a @ b
        iters += 10
        sync_device(device)
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return 2.0 * n**3 * iters / elapsed / 1e12


def remembered_peak(device: torch.device, dtype: torch.dtype, folder: Path) -> float:
    """:func:`measure_matmul_tflops`, measured once per GPU model, torch build and dtype and
    kept in ``folder/peaks.json`` (half a second of every start otherwise). On CPU, whose
    rate depends on what else runs, it is measured every time."""
    if device.type != "cuda":
        return measure_matmul_tflops(device, dtype)
    key = f"{torch.cuda.get_device_name(device)} | torch {torch.__version__} | {dtype}"
    path = folder / "peaks.json"
    try:  # envguard's own state: a link or anything but a small regular file is not read
        known = json.loads(read_bounded(path, limit=1 << 20, what="peaks", follow=False))
    except (OSError, ValueError):
        known = {}
    if not isinstance(known, dict):
        known = {}
    value = known.get(key)
    if isinstance(value, (int, float)) and value > 0:
        return float(value)
    measured = measure_matmul_tflops(device, dtype)
    with contextlib.suppress(OSError, EnvguardError):  # a cache only: a failed write costs time
        write_text_atomic(path, json.dumps({**known, key: measured}, indent=2,
                                           sort_keys=True) + "\n")
    return measured


def _process_start() -> float:
    """When this process started (wall clock): the first record's ``since_start_s`` is
    the time to the first logged step, cold or warm."""
    import psutil

    return float(psutil.Process().create_time())


class Meter:
    """Sums of step metrics on the device between two log points."""

    def __init__(self) -> None:
        self.steps = 0
        self.loss: Tensor | float = 0.0
        self.tau: Tensor | float = 0.0
        self.grad_norm: Tensor | float = 0.0
        self.hits_K: Tensor | float = 0.0
        self.count_K: Tensor | float = 0.0
        self.pairs: Tensor | float = 0.0
        self.ctx_tokens = 0
        self.draft_tokens = 0
        self.lr = 0.0
        """The learning rate of the last step added."""

    def add(self, out: LossOutput, pairs: Tensor, grad_norm: Tensor, lr: float,
            ctx_tokens: int, draft_tokens: int) -> None:
        self.steps += 1
        self.lr = lr
        self.loss = self.loss + out.loss.detach()
        self.tau = self.tau + out.tau_sim
        self.grad_norm = self.grad_norm + grad_norm
        self.hits_K = self.hits_K + torch.nan_to_num(out.acc_K) * out.count_K
        self.count_K = self.count_K + out.count_K
        self.pairs = self.pairs + pairs
        self.ctx_tokens += ctx_tokens
        self.draft_tokens += draft_tokens

    def check_finite(self, step: int) -> None:
        """Stop the run (RunError, exit 4) once the loss or the gradient norm of a step
        since the last log point is NaN or infinite: the weights the next checkpoint or
        the export would keep are no longer numbers. One wait for the device; every rank
        decides alike (the gradient norm is global under FSDP2; the record's loss is
        reduced)."""
        if self.steps and not all(bool(torch.isfinite(torch.as_tensor(v)).all().item())
                                  for v in (self.loss, self.grad_norm)):
            raise RunError(f"the training diverged by step {step}: the loss or the gradient "
                           "norm is NaN or infinite. Nothing after it is saved; resume from "
                           "the last checkpoint with a lower lr (or a smaller grad_clip)")

    def peek(self) -> dict[str, float | None]:
        """This rank's mean loss and tau_sim since the last log point, not reduced over
        ranks and without a collective (the heartbeat's line); waits for the device."""
        if not self.steps:
            return {}
        return {"loss": finite_or_none(float(torch.as_tensor(self.loss).item()) / self.steps),
                "tau": float(torch.as_tensor(self.tau).item()) / self.steps}

    def reader(self, held: Values) -> Callable[[], Values]:
        """A tick's values (:class:`dflash.ticks.Tick`): :meth:`peek`, and ``held``
        (the latest held-out figures) as they are when read."""
        return lambda: {**self.peek(), **held}

    def reduce(self, world: World, device: torch.device) -> None:
        """Sum over ranks (a collective at log points only): losses and tau become means
        over ranks, counts and tokens totals."""
        if not world.distributed:
            return
        hits = torch.as_tensor(self.hits_K, device=device).double().reshape(-1)
        counts = torch.as_tensor(self.count_K, device=device).double().reshape(-1)
        k = hits.numel()
        scalars = [torch.as_tensor(v, device=device).double().reshape(1)
                   for v in (self.loss, self.tau, self.pairs)]
        vec = all_reduce_sum(world, torch.cat([*scalars, hits, counts]))
        self.loss, self.tau, self.pairs = vec[0] / world.size, vec[1] / world.size, vec[2]
        self.hits_K, self.count_K = vec[3:3 + k], vec[3 + k:]
        self.ctx_tokens *= world.size
        self.draft_tokens *= world.size

    def record(self, *, step: int, seconds: float, flops: FlopModel, peak_tflops: float,
               world: World, device: torch.device) -> dict[str, Any]:
        """One metrics.jsonl record at ``step``, ``seconds`` after the previous one; a
        collective under torchrun (every rank calls it)."""
        self.reduce(world, device)
        self.check_finite(step)
        n = max(1, self.steps)
        acc = (torch.as_tensor(self.hits_K) / torch.as_tensor(self.count_K).clamp_min(1)).tolist()
        step_flops = flops.step_flops(self.ctx_tokens, self.draft_tokens,
                                      float(torch.as_tensor(self.pairs).item()))
        record: dict[str, Any] = {
            "step": step,
            "loss": finite_or_none(float(torch.as_tensor(self.loss).item()) / n),
            "tau_sim": float(torch.as_tensor(self.tau).item()) / n,
            "acc": [round(a, 4) for a in acc[1:]],
            "grad_norm": finite_or_none(float(torch.as_tensor(self.grad_norm).item()) / n),
            "lr": self.lr,
            "step_s": seconds / n,
            "ctx_tok_s": self.ctx_tokens / seconds,
            "draft_tok_s": self.draft_tokens / seconds,
            "tflops": step_flops / seconds / 1e12,
            "mfu": step_flops / seconds / 1e12 / (peak_tflops * world.device_count),
            "peak_tflops": peak_tflops,
            "since_start_s": time.time() - _process_start(),
        }
        if device.type == "cuda":
            record["peak_mem_gb"] = torch.cuda.max_memory_allocated(device) / 2**30
        return record


class MetricsLog:
    """Appends one JSON object per line to OUT/metrics.jsonl, flushed per record so a
    killed run keeps every line it logged.

    A run starting at step ``after`` (0, or the step it resumed from) first keeps only the
    lines of steps up to ``after``: those after it were logged past the checkpoint it
    resumed from and are about to be logged again; a run from step 0 starts the file empty.
    A line cut short by a kill is dropped with them."""

    def __init__(self, path: Path, *, after: int = 0) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        if path.exists():
            kept = [line for line in _lines(path) if _step_of(line) <= after]
            write_text_atomic(path, "".join(f"{line}\n" for line in kept))
        self._fh = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()

    def write(self, record: dict[str, Any]) -> None:
        self._fh.write(json.dumps(record, allow_nan=False, default=_jsonable) + "\n")
        self._fh.flush()
        os.fsync(self._fh.fileno())

    def close(self) -> None:
        self._fh.close()


_METRICS_BYTES = 1 << 32
"""4 GiB: a metrics.jsonl read back on resume (a record is under 1 kB: millions of steps)."""


def _lines(path: Path) -> list[str]:
    try:
        text = read_bounded_text(path, limit=_METRICS_BYTES, what="metrics log")
    except NotReadable as exc:
        raise InputError(str(exc)) from None
    return text.splitlines()


def _step_of(line: str) -> float:
    """The step a metrics line records; infinity for a line that is not a record (cut
    short by a kill), so it is dropped."""
    try:
        record = json.loads(line)
    except ValueError:
        return float("inf")
    step = record.get("step") if isinstance(record, dict) else None
    return step if isinstance(step, int) and not isinstance(step, bool) else float("inf")


def _jsonable(value: object) -> object:
    if isinstance(value, float):
        return None
    raise TypeError(f"not JSON: {type(value).__name__}")


def finite_or_none(x: float) -> float | None:
    return x if x == x and abs(x) != float("inf") else None
