"""Two tiny threading helpers, instead of ``concurrent.futures``.

``concurrent.futures`` (with the ``logging`` it pulls in) costs about 8 ms of
import on every snapshot; envguard only needs "run this in the background" and
"map over a few batches in N threads", which plain threads do.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")


class Task(Generic[T]):
    """A call running in a daemon thread; ``result()`` joins and re-raises its exception."""

    def __init__(self, fn: Callable[[], T]) -> None:
        self._fn = fn
        self._value: T | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._value = self._fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller in result()
            self._error = exc

    def done(self) -> bool:
        """Whether the call has returned (or raised): :meth:`result` will not wait."""
        return not self._thread.is_alive()

    def result(self) -> T:
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[return-value]


def parallel_map(fn: Callable[[T], R], items: Iterable[T], workers: int) -> Iterator[R]:
    """``fn`` over ``items`` in ``workers`` threads; results in input order, as they are ready.

    Results are yielded in order while later items are still being worked on, so a
    caller can report progress. An exception in ``fn`` is re-raised in the caller.
    """
    work: queue.SimpleQueue[tuple[int, T] | None] = queue.SimpleQueue()
    done: dict[int, tuple[R | None, BaseException | None]] = {}
    ready = threading.Condition()
    count = 0
    for count, item in enumerate(items, 1):
        work.put((count - 1, item))
    n = max(1, min(workers, count))
    for _ in range(n):
        work.put(None)

    def worker() -> None:
        while (job := work.get()) is not None:
            index, item = job
            try:
                out: tuple[R | None, BaseException | None] = (fn(item), None)
            except BaseException as exc:  # noqa: BLE001 - re-raised in the caller
                out = (None, exc)
            with ready:
                done[index] = out
                ready.notify_all()

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(n)]
    for t in threads:
        t.start()
    for index in range(count):
        with ready:
            ready.wait_for(lambda i=index: i in done)  # type: ignore[misc]
            value, error = done.pop(index)
        if error is not None:
            raise error
        yield value  # type: ignore[misc]
    for t in threads:
        t.join()
