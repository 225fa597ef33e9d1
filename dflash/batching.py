"""Batches for the training loop: fixed shapes, a resumable order, this rank's share, and a
prefetch thread.

* :class:`BatchLoader`: endless epochs of ``[batch_size, bucket]`` batches whose order
  depends only on (seed, epoch), so compile sees fixed shapes and a checkpoint's data
  position is two numbers;
* :class:`RankSlice`: under torchrun every rank walks the same stream and takes every
  WORLD_SIZE-th batch, offset by its rank, so the position is the same whatever the
  world size, and a checkpoint resumes at another world size;
* :class:`Prefetcher`: one thread that never touches compiled code. It starts only after
  the trainer's warm-up (compile happens on the main thread, first), builds the next
  batches and copies them to the device, and hands each one over together with the
  loader position *after* it, so a checkpoint records exactly the batches the optimizer
  consumed, not the ones waiting in the queue.
"""

from __future__ import annotations

import bisect
import queue
import random
import threading
import zlib
from array import array
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from dflash.data import Example, short_repr
from dflash.distributed.world import World


@dataclass(frozen=True, slots=True)
class Batch:
    """Padded int64 tensors [batch_size, bucket]; ``loss_mask_BS`` is 0 on padding."""

    input_ids_BS: torch.Tensor
    loss_mask_BS: torch.Tensor
    bucket: int


class BatchLoader:
    """Endless epochs of fixed-shape batches; the order depends only on (seed, epoch).

    An epoch shuffles the examples with ``random.Random(seed + epoch)``, puts each in the
    smallest bucket that holds it (cutting longer ones to the largest), cuts each bucket into
    batches (the last one filled with all-pad rows) and shuffles the batches. Thread-safe.
    """

    def __init__(self, examples: list[Example], *, batch_size: int, buckets: tuple[int, ...],
                 seed: int, pad_id: int) -> None:
        for bad, reason in ((not examples, "no examples to batch"),
                            (batch_size < 1, f"batch_size must be >= 1, got {batch_size}"),
                            (not buckets or min(buckets) < 1, f"bad buckets {buckets}"),
                            (pad_id < 0, f"pad_id must be >= 0, got {pad_id}")):
            if bad:
                raise ValueError(reason)
        self._batch_size, self._seed, self._pad_id = batch_size, seed, pad_id
        self._buckets = tuple(sorted(set(buckets)))
        top = self._buckets[-1]
        self._rows = [(ex.input_ids[:top], ex.loss_mask[:top]) for ex in examples]
        self._bucket_of = [bisect.bisect_left(self._buckets, len(ids)) for ids, _ in self._rows]
        self._counts = [self._bucket_of.count(b) for b in range(len(self._buckets))]
        self._epoch_len = sum(-(-c // batch_size) for c in self._counts)
        summary = array("q", [v for ids, mask in self._rows for v in (len(ids), sum(mask))])
        self._fingerprint = f"{zlib.crc32(summary.tobytes()):08x}"
        self._epoch, self._position = 0, 0
        self._plan: list[tuple[int, tuple[int, ...]]] = []
        self._plan_epoch = -1
        self._lock = threading.Lock()

    @property
    def batches_per_epoch(self) -> int:
        return self._epoch_len

    def shapes(self) -> list[tuple[int, int]]:
        """Every (batch_size, bucket) that :meth:`next_batch` can return, increasing."""
        return [(self._batch_size, b) for b, c in zip(self._buckets, self._counts, strict=True)
                if c]

    def _epoch_plan(self, epoch: int) -> list[tuple[int, tuple[int, ...]]]:
        rng = random.Random(self._seed + epoch)  # noqa: S311 - a data order, not a secret
        order = list(range(len(self._rows)))
        rng.shuffle(order)
        groups: list[list[int]] = [[] for _ in self._buckets]
        for i in order:
            groups[self._bucket_of[i]].append(i)
        bs = self._batch_size
        plan = [(b, tuple(g[k: k + bs])) for b, g in enumerate(groups)
                for k in range(0, len(g), bs)]
        rng.shuffle(plan)
        return plan

    def next_batch(self) -> Batch:
        with self._lock:
            if self._plan_epoch != self._epoch:
                self._plan, self._plan_epoch = self._epoch_plan(self._epoch), self._epoch
            b, members = self._plan[self._position]
            self._position += 1
            if self._position == self._epoch_len:
                self._epoch, self._position = self._epoch + 1, 0
        bucket = self._buckets[b]
        ids_BS = torch.full((self._batch_size, bucket), self._pad_id, dtype=torch.long)
        mask_BS = torch.zeros((self._batch_size, bucket), dtype=torch.long)
        for r, i in enumerate(members):
            ids, mask = self._rows[i]
            ids_BS[r, : len(ids)] = torch.tensor(ids, dtype=torch.long)
            mask_BS[r, : len(mask)] = torch.tensor(mask, dtype=torch.long)
        return Batch(ids_BS, mask_BS, bucket)

    def _identity(self) -> dict[str, Any]:
        return {"num_examples": len(self._rows), "fingerprint": self._fingerprint,
                "batch_size": self._batch_size, "buckets": list(self._buckets),
                "seed": self._seed}

    def state_dict(self) -> dict[str, Any]:
        """A fresh dict of plain ints, strings and lists: the position after the last batch."""
        with self._lock:
            return {"epoch": self._epoch, "position": self._position, **self._identity()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state``; ValueError if it belongs to other data or settings."""
        if not isinstance(state, dict):
            raise ValueError(f"loader state must be a dict, got {type(state).__name__}")
        for key, want in self._identity().items():
            got = state.get(key)
            if type(got) is not type(want) or got != want:
                raise ValueError(f"loader state is for other data or settings: {key} is "
                                 f"{short_repr(got)}, this loader has {short_repr(want)}")
        epoch, position = state.get("epoch"), state.get("position")
        if type(epoch) is not int or epoch < 0:
            raise ValueError(f"loader state has a bad epoch: {short_repr(epoch)}")
        if type(position) is not int or not 0 <= position < self._epoch_len:
            raise ValueError(f"loader state has a bad position: {short_repr(position)} "
                             f"(an epoch has {self._epoch_len} batches)")
        with self._lock:
            self._epoch, self._position = epoch, position


class RankSlice:
    """Rank r of W takes batches r, r+W, r+2W, ... of the shared stream."""

    def __init__(self, loader: BatchLoader, world: World) -> None:
        self.loader = loader
        self.world = world

    def next_batch(self) -> Batch:
        mine = None
        for i in range(self.world.size):
            batch = self.loader.next_batch()
            if i == self.world.rank:
                mine = batch
        if mine is None:
            raise ValueError(f"rank {self.world.rank} is outside a world of {self.world.size}")
        return mine

    def state_dict(self) -> dict[str, Any]:
        return self.loader.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.loader.load_state_dict(state)

    def shapes(self) -> list[tuple[int, int]]:
        return self.loader.shapes()


class Prefetcher:
    def __init__(self, loader: BatchLoader | RankSlice, device: torch.device,
                 depth: int = 2) -> None:
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
