"""torch's heavy imports without the cyclic garbage collector running through them.

Importing torch and, for ``torch.compile``, dynamo and inductor creates about 600,000
objects that live as long as the process; the collector's generational passes walk them
again and again while they are made, and that is a fifth of the import's time (2.63
against 2.07 s on a 2-core VM, ``benchmarks/import_gc.py``; on the GPU host, placing the
drafter, which is mostly this import, fell from 2.9 to 1.6-1.9 s).
:func:`without_collection` turns the collector off for an import and then freezes what
exists (``gc.freeze``: those objects move to a generation no later pass walks), so the
warm-up and the training loop do not walk them either. Imports make almost no cyclic
garbage; what little there is stays.

A Ctrl-C that lands inside these imports is held until the import is done, then raised
(:func:`interrupt_after`): torch's import machinery does not survive a KeyboardInterrupt
halfway. Sent at the wrong moment of ``import torch``, one was swallowed (the launch
trained on), another left torch half-imported and the launch failing later with a
RecursionError.

Nothing here imports torch: the CLI calls it before torch is loaded.
"""

from __future__ import annotations

import gc
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def without_collection() -> Iterator[None]:
    """The collector off for the block; afterwards everything alive is frozen and the
    collector is back as it was."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if enabled:
            gc.enable()


@contextmanager
def interrupt_after() -> Iterator[None]:
    """A SIGINT during the block raises KeyboardInterrupt after it, not inside it. Only
    on the main thread and where SIGINT has Python's default handler (a SIGINT that is
    ignored, or handled by the program, is left as it is)."""
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler):
        yield
        return
    arrived: list[int] = []
    signal.signal(signal.SIGINT, lambda signum, frame: arrived.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if arrived:
        raise KeyboardInterrupt


def import_torch() -> None:
    """``import torch`` under :func:`without_collection` and :func:`interrupt_after`."""
    with interrupt_after(), without_collection():
        import torch  # noqa: F401


def import_compiler() -> None:
    """What ``torch.compile`` and its first call import (dynamo, then inductor's
    ``compile_fx``), as :func:`import_torch`: once, before the handles are made."""
    with interrupt_after(), without_collection():
        import torch._dynamo
        import torch._inductor.compile_fx  # noqa: F401
