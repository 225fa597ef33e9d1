"""The compile race, reproduced and guarded: ``python -m dflash.compilation.race``.

Several threads run flex_attention with the DFlash mask, as the incident's trainer ran
one drafter per thread. Two ways to start them:

* ``naive``: every thread compiles its own flex_attention and calls it for the first
  time at once (the incident's pattern; it hung on torch 2.11 on an H200);
* ``guarded``: the trainer's way: the process's single compiled handle, one warm-up
  call per shape on the main thread (forward and, where supported, backward), then
  ``fail_on_recompile``, and only then the threads.

It prints one JSON object: per-thread outcome (``ok`` or the error's first line), the
global FX-tracing flag afterwards, and ``hang`` if a thread did not finish within
``--timeout`` (the process then exits 3 without waiting for it). Run it in a fresh
process with empty TORCHINDUCTOR_CACHE_DIR / TRITON_CACHE_DIR to see a cold start.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import torch

from dflash.compilation.kernels import fx_tracing_flag, kernels, seal, unseal
from dflash.compilation.megacache import for_setting
from dflash.masks import dflash_block_mask


def _inputs(seq: int, heads: int, head_dim: int, block_size: int, device: torch.device,
            dtype: torch.dtype, backward: bool) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator(device="cpu").manual_seed(seq)
    n_blocks = max(1, seq // (4 * block_size))
    anchors = torch.sort(torch.randperm(seq - block_size, generator=gen)[:n_blocks]).values
    keep = torch.ones(n_blocks, dtype=torch.bool)
    q_len = n_blocks * block_size

    def rnd(length: int) -> torch.Tensor:
        t = torch.randn(1, heads, length, head_dim, generator=gen).to(device, dtype)
        return t.requires_grad_(backward)

    return (rnd(q_len), rnd(seq + q_len), rnd(seq + q_len), anchors.to(device), keep.to(device))


def _call(flex: Callable[..., Any], builder: Callable[..., Any],
          inputs: tuple[torch.Tensor, ...], seq: int, block_size: int, backward: bool) -> None:
    q, k, v, anchors, keep = inputs
    mask = dflash_block_mask(anchors, keep, seq, block_size, builder=builder)
    out = flex(q, k, v, block_mask=mask)
    if backward:
        out.float().sum().backward()


def run(mode: str, threads: int, iters: int, seqs: list[int], device: torch.device,
        dtype: torch.dtype, backward: bool, timeout: float, late_seq: int | None = None,
        mega_cache: str = "off") -> dict[str, Any]:
    heads, head_dim, block_size = 4, 64, 16
    per_thread = [seqs[i % len(seqs)] for i in range(threads)]
    inputs = {s: _inputs(s, heads, head_dim, block_size, device, dtype, backward)
              for s in set(per_thread)}
    outcomes: list[str] = ["hang"] * threads
    start = time.perf_counter()
    warmup_s = 0.0
    handles: tuple[Any, Any] = (None, None)
    mega = for_setting(mega_cache) if mode == "guarded" else None
    mega_loaded = mega.load() if mega is not None else None
    mega_saved = 0
    if mode == "guarded":
        k = kernels(True)
        handles = (k.flex, k.block_mask_builder)
        for s in sorted(inputs):
            _call(k.flex, k.block_mask_builder, inputs[s], s, block_size, backward)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        seal()
        warmup_s = time.perf_counter() - start
        if mega is not None and mega_loaded is None:
            mega_saved = mega.save()
    barrier = threading.Barrier(threads)

    def worker(i: int) -> None:
        try:
            if mode == "naive":
                flex = torch.compile(torch.nn.attention.flex_attention.flex_attention,
                                     dynamic=False)
                builder = torch.compile(torch.nn.attention.flex_attention.create_block_mask)
            else:
                flex, builder = handles  # the process's single compiled handles
            barrier.wait()
            s = per_thread[i]
            for _ in range(iters):
                _call(flex, builder, inputs[s], s, block_size, backward)
            outcomes[i] = "ok"
        except Exception as exc:  # noqa: BLE001 - the outcome is the measurement
            outcomes[i] = f"error: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"

    pool = [threading.Thread(target=worker, args=(i,), name=f"drafter-{i}", daemon=True)
            for i in range(threads)]
    for t in pool:
        t.start()
    deadline = time.monotonic() + timeout
    for t in pool:
        t.join(max(0.0, deadline - time.monotonic()))
    hung = any(t.is_alive() for t in pool)
    late = None
    if mode == "guarded" and late_seq and not hung:
        # A shape the warm-up never saw, on a helper thread: sealed, so it must be
        # refused at once instead of compiling there.
        late_in = _inputs(late_seq, heads, head_dim, block_size, device, dtype, backward)
        box: list[str] = ["hang"]

        def late_call() -> None:
            try:
                _call(handles[0], handles[1], late_in, late_seq, block_size, backward)
                box[0] = "ok"
            except Exception as exc:  # noqa: BLE001 - the outcome is the measurement
                box[0] = f"error: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"

        t = threading.Thread(target=late_call, name="late-shape", daemon=True)
        t.start()
        t.join(timeout)
        late = box[0]
    if mode == "guarded":
        unseal()
    return {"mode": mode, "threads": threads, "iters": iters, "seqs": per_thread,
            "backward": backward, "device": str(device), "torch": torch.__version__,
            "torch_git": torch.version.git_version, "outcomes": list(outcomes),
            "ok": outcomes.count("ok"), "hang": hung,
            "fx_tracing_flag_after": fx_tracing_flag(), "warmup_s": round(warmup_s, 3),
            "total_s": round(time.perf_counter() - start, 3),
            "late_shape": late, "inductor_cache": os.environ.get("TORCHINDUCTOR_CACHE_DIR", ""),
            "mega_cache_load_s": mega_loaded, "mega_cache_saved_bytes": mega_saved}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dflash.compilation.race", description=__doc__)
    parser.add_argument("--mode", choices=["naive", "guarded"], required=True)
    parser.add_argument("--threads", type=int, default=3)
    parser.add_argument("--iters", type=int, default=3)
    parser.add_argument("--seq", type=int, action="append",
                        help="sequence length per thread (repeat for distinct shapes)")
    parser.add_argument("--device", help="default: cuda:LOCAL_RANK (one GPU per torchrun "
                        "rank) if CUDA is available, else cpu")
    parser.add_argument("--timeout", type=float, default=120.0)
    parser.add_argument("--late-seq", type=int,
                        help="guarded: afterwards, call with this unseen length on a thread "
                        "(must be refused, not compiled)")
    parser.add_argument("--mega-cache", default="off",
                        help="guarded: off, auto or a folder; load a Mega-Cache artifact "
                        "for this build before the warm-up, save one after it otherwise")
    args = parser.parse_args(argv)
    if args.device is None:
        args.device = (f"cuda:{os.environ.get('LOCAL_RANK', '0')}" if torch.cuda.is_available()
                       else "cpu")
    device = torch.device(args.device)
    gpu = device.type == "cuda"
    if gpu:
        torch.cuda.set_device(device)
    result = run(args.mode, args.threads, args.iters, args.seq or [256], device,
                 torch.bfloat16 if gpu else torch.float32, backward=gpu, timeout=args.timeout,
                 late_seq=args.late_seq, mega_cache=args.mega_cache)
    print(json.dumps(result), flush=True)
    if result["hang"]:
        os._exit(3)  # a hung compile thread would block interpreter exit forever
    return 0 if result["ok"] == args.threads and not result["fx_tracing_flag_after"] else 1


if __name__ == "__main__":
    sys.exit(main())
