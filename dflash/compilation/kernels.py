"""torch.compile for the trainer, race-free by construction.

Concurrent first-time compilation is not thread-safe in any torch release up to 2.13:
the FX-tracing flag is a process global, and a thread calling compiled code while
another traces either raises, hangs (torch 2.11 on an H200), or silently falls back to
dense attention for good (docs/COMPILE-RACE.md). The rules here:

* **One compiled flex_attention handle per process** (:func:`compiled_flex`), and one
  compiled ``create_block_mask``; nothing else in dflash calls ``torch.compile`` on them.
* **Compile only on the main thread.** The trainer runs one full warm-up step per batch
  shape (forward and backward) before any helper thread starts; :func:`require_main_thread`
  refuses anything else.
* **Then seal** (:func:`seal`): ``set_stance("fail_on_recompile")``, so a late recompile
  (new shape, failed guard) raises instead of reopening the race on some thread, and the
  global tracing flag is checked to be clear. A set flag means the process is poisoned
  (every later compiled call would fail or run dense eager attention): abort.
* Never ``error_on_nested_fx_trace=False``: it turns the error into that silent fallback.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

from dflash.compilation.imports import import_compiler
from dflash.errors import CompileStateError

_lock = threading.Lock()
_handles: dict[str, Callable[..., Any]] = {}


def require_main_thread(what: str) -> None:
    if threading.current_thread() is not threading.main_thread():
        raise CompileStateError(
            f"{what} must run on the main thread: torch.compile is not thread-safe "
            f"(called from thread {threading.current_thread().name!r})")


def _handle(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    with _lock:
        if name not in _handles:
            _handles[name] = torch.compile(fn, dynamic=False)
        return _handles[name]


def compiled_flex() -> Callable[..., Any]:
    """The process's single compiled flex_attention (compiles lazily on first call)."""
    return _handle("flex_attention", flex_attention)


def compiled_block_mask() -> Callable[..., Any]:
    """The process's single compiled create_block_mask (block-sparse, no dense [Q, KV])."""
    return _handle("create_block_mask", create_block_mask)


def start_compile_workers() -> None:
    """Start inductor's compile workers now, as its backend does at the first compile.

    A warm-up that will compile for real (:func:`dflash.compilation.megacache.
    compile_will_run`) otherwise waits for them: a sidecar process imports torch, then
    forks one worker per core, and on a new machine that import alone takes seconds.
    Started as the drafter's placing ends, they come up while the trainer waits for its
    data, and are up by its warm-up. Only the main thread. A torch without the call, or
    one that cannot start them here, is left to start them at the first compile, as it
    always does (and to say why it cannot)."""
    require_main_thread("starting the compile workers")
    try:
        from torch._inductor.async_compile import maybe_warm_pool

        maybe_warm_pool()
    except Exception:  # noqa: BLE001, S110 - torch's own first compile tries again
        pass


def fx_tracing_flag() -> bool:
    """torch's process-global 'an FX trace is running' flag (False when absent)."""
    module = getattr(torch.fx, "_symbolic_trace", None)
    return bool(getattr(module, "_is_fx_tracing_flag", False))


def assert_not_poisoned() -> None:
    if fx_tracing_flag():
        raise CompileStateError(
            "torch.fx's global tracing flag is set with no trace running: every compiled "
            "call would now fail or fall back to dense eager attention; restart the process")


@dataclass(frozen=True, slots=True)
class Kernels:
    """The attention functions a trainer process uses, chosen once at start."""

    flex: Callable[..., Any]
    """flex_attention: the compiled handle, or eager (CPU tests, forward only)."""
    block_mask_builder: Callable[..., Any]
    """create_block_mask: compiled on GPU, eager otherwise."""
    compiled: bool


def kernels(compile_attention: bool) -> Kernels:
    if compile_attention:
        require_main_thread("creating compiled kernels")
        import_compiler()
        return Kernels(flex=compiled_flex(), block_mask_builder=compiled_block_mask(),
                       compiled=True)
    return Kernels(flex=flex_attention, block_mask_builder=create_block_mask, compiled=False)


def seal() -> None:
    """After warm-up: no more compilation anywhere in this process."""
    require_main_thread("sealing compilation")
    assert_not_poisoned()
    torch.compiler.set_stance("fail_on_recompile")


def unseal() -> None:
    """Back to the default stance (tests, and a trainer that is done)."""
    torch.compiler.set_stance("default")
