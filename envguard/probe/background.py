"""Small concurrency helpers, instead of ``concurrent.futures`` and ``multiprocessing``.

``concurrent.futures`` (with the ``logging`` it pulls in) costs about 8 ms of
import on every snapshot; envguard only needs "run this in the background" and
"map over a few batches in N threads", which plain threads do, and "compute this in a
forked child" (:class:`Forked`) for the one job threads cannot speed up, ``stat``-ing
tens of thousands of files.
"""

from __future__ import annotations

import contextlib
import marshal
import os
import queue
import signal
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Generic, TypeVar

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


def fork_is_safe() -> bool:
    """Whether :class:`Forked` may fork here: on Linux, from a process with no other thread
    (a fork copies only the calling thread, and a lock another thread held stays held in
    the child; Python 3.12 warns for that reason). Elsewhere, or with threads: never."""
    return (sys.platform.startswith("linux") and hasattr(os, "fork")
            and threading.active_count() == 1)


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask, as ``taskset`` or a container
    sets it), else ``os.cpu_count()``."""
    with contextlib.suppress(AttributeError, OSError):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


class Forked:
    """``fn()`` computed in a forked child, its value passed back through a pipe with
    ``marshal`` (so it must be plain data: tuples, lists, strings, numbers, None).

    The child leaves with ``os._exit``: it never flushes the parent's stdio buffers or
    runs its ``atexit`` handlers. :meth:`result` is None when the child failed (an
    exception, a signal, garbage); the caller then does the work itself.
    """

    def __init__(self, fn: Callable[[], Any]) -> None:
        """Fork now; call only where :func:`fork_is_safe`. Raises OSError if fork fails."""
        read_fd, write_fd = os.pipe()
        try:
            pid = os.fork()
        except OSError:
            os.close(read_fd)
            os.close(write_fd)
            raise
        if pid == 0:  # the child: compute, write, leave
            status = 1
            try:
                os.close(read_fd)
                data = marshal.dumps(fn())
                with open(write_fd, "wb", closefd=True) as out:
                    out.write(data)
                status = 0
            finally:
                os._exit(status)
        os.close(write_fd)
        self._pid, self._fd = pid, read_fd
        self._done = False
        self._value: Any = None

    def result(self) -> Any:
        """The child's value, or None if it failed. Waits for it."""
        if not self._done:
            self._done = True
            try:
                with open(self._fd, "rb", closefd=True) as src:
                    data = src.read()
            finally:
                _, status = os.waitpid(self._pid, 0)
            if os.waitstatus_to_exitcode(status) == 0:
                with contextlib.suppress(EOFError, ValueError, TypeError):
                    self._value = marshal.loads(data)  # noqa: S302 - our own child's answer
        return self._value

    def abandon(self) -> None:
        """Kill the child (an interrupted caller) and reap it."""
        if not self._done:
            self._done = True
            with contextlib.suppress(OSError):
                os.kill(self._pid, signal.SIGKILL)
            with contextlib.suppress(OSError):
                os.close(self._fd)
            with contextlib.suppress(OSError):
                os.waitpid(self._pid, 0)
