"""A one-thread batch prefetcher that never touches compiled code.

It starts only after the trainer's warm-up (compile happens on the main thread, first),
builds the next batches in Python and copies them to the device, and hands each one
over together with the loader position *after* it, so a checkpoint records exactly
the batches the optimizer consumed, not the ones waiting in the queue.
"""

from __future__ import annotations

import queue
import threading
from typing import Any, Protocol

import torch
from torch import Tensor


class _Loader(Protocol):
    def next_batch(self) -> Any: ...
    def state_dict(self) -> dict[str, Any]: ...


class Prefetcher:
    def __init__(self, loader: _Loader, device: torch.device, depth: int = 2) -> None:
        self._loader = loader
        self._device = device
        self._queue: queue.Queue[tuple[Tensor, Tensor, dict[str, Any]] | BaseException] = (
            queue.Queue(maxsize=depth))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="dflash-prefetch", daemon=True)

    def start(self) -> Prefetcher:
        self._thread.start()
        return self

    def _to_device(self, t: Tensor) -> Tensor:
        if self._device.type == "cuda":
            return t.pin_memory().to(self._device, non_blocking=True)
        return t.to(self._device)

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                batch = self._loader.next_batch()
                item = (self._to_device(batch.input_ids_BS), self._to_device(batch.loss_mask_BS),
                        self._loader.state_dict())
                while not self._stop.is_set():
                    try:
                        self._queue.put(item, timeout=0.1)
                        break
                    except queue.Full:
                        continue
        except BaseException as exc:  # noqa: BLE001 - re-raised on the main thread
            self._queue.put(exc)

    def get(self, timeout: float = 600.0) -> tuple[Tensor, Tensor, dict[str, Any]]:
        item = self._queue.get(timeout=timeout)
        if isinstance(item, BaseException):
            raise item
        return item

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
