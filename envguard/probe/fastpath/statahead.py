"""The RECORD check's ``stat`` work, shared with forked workers, and started ahead.

A default snapshot stats every file the RECORDs list: 26,600 files of a CUDA torch venv
take 70-80 ms of system calls on a 2-core machine, the largest part of a snapshot.
Threads cannot share that work (the per-row Python work serialises on the GIL), forked
processes can.

:class:`StatQueue` cuts the rows into units of a few hundred and writes the unit numbers
into a pipe. Forked workers and this process take numbers from the pipe until it is
empty, so each unit is checked once, by whoever is free, and a slow or late worker only
takes fewer. A worker that fails loses nothing: this process checks every unit nobody
answered for.

:func:`start` begins before the snapshot's collector has even been imported. It reads
the records memo of the environment (:class:`~envguard.probe.fastpath.records.RecordMemo`:
the RECORD rows the last snapshot of that prefix parsed) and forks workers on those rows
while this process imports the rest of envguard and scans the dist-info folders. The
collector then :func:`take`\\ s it: the scan reads through the same memo, and marks a
distribution whose dist-info folder it read from the memo (every file kept its stat key:
:attr:`~envguard.probe.distributions.InstalledDist.from_memo`). The integrity check claims
a distribution's units only when it is so marked and its RECORD time is the one the units
were made with (:meth:`Ahead.units_for`): its rows are then the memo's, the ones the
workers checked. Anything else (a distribution installed, upgraded or patched since) is
checked by this process as usual, and a worker's answer for it is ignored.

Forking needs a process with no other thread (:func:`~envguard.probe.background.fork_is_safe`),
so :func:`start` runs before any thread starts: a command calls it as soon as it knows
its environment, and the collector before it starts its own threads. Nothing here imports
:mod:`envguard.model` (the fork would wait for it).
"""

from __future__ import annotations

import atexit
import os
from collections.abc import Collection
from pathlib import Path

from envguard.probe.background import Forked, fork_is_safe, usable_cpus
from envguard.probe.fastpath.records import RecordMemo
from envguard.probe.fastpath.rows import CHUNK_ROWS, RecordRows
from envguard.probe.recordcheck import Checked, check_rows, decode, encode, vouched_by_folders

Unit = tuple[str, RecordRows, int, int | None, int]
"""(site folder, one distribution's rows, the number of the chunk of them to check, when its
RECORD was written, the chunk's row count)."""

UNIT_ROWS = CHUNK_ROWS
"""Rows per unit, one chunk of :class:`~envguard.probe.fastpath.records.RecordRows`: about
1.5 ms of ``stat`` on a 2-core VM, small enough to balance."""
MAX_BATCHES = 1024
"""Numbers in the pipe, 4 bytes each: 1,024 fill one page, which every pipe holds (Linux
shrinks a pipe to one page when a user holds too many), so writing them never blocks."""
FORK_MIN_ROWS = 5000
"""Rows per process below which a fork costs more than it saves."""
MAX_WORKERS = 7


def unit_rows(total: int) -> int:
    """Rows per batch for ``total`` rows in all: :data:`UNIT_ROWS`, or more where that would
    make more than :data:`MAX_BATCHES` batches."""
    return max(UNIT_ROWS, -(-total // (MAX_BATCHES - 1)))


def units_of(site_dir: str, rows: RecordRows, installed_ns: int | None) -> list[Unit]:
    """One distribution's rows in units, a chunk each."""
    return [(site_dir, rows, number, installed_ns, size)
            for number, size in enumerate(rows.chunk_sizes())]


def check_unit(unit: Unit) -> Checked:
    """The size-mode check of one unit's rows (a forked worker unpacks its chunks itself); a
    chunk of header rows whose folders are all unchanged is not even unpacked."""
    site_dir, rows, number, installed_ns, _ = unit
    summary = rows.chunk_summary(number)
    if summary is not None and installed_ns is not None:
        vouched = vouched_by_folders(site_dir, summary, installed_ns)
        if vouched is not None:
            return Checked(issues=[], jobs=[], by_folder=vouched)
    return check_rows(site_dir, rows.chunk_rows(number), installed_ns)


def worker_count(rows: int) -> int:
    """Forked workers worth starting for ``rows`` rows, beside this process."""
    if rows < 2 * FORK_MIN_ROWS or not fork_is_safe():
        return 0
    return max(0, min(usable_cpus() - 1, MAX_WORKERS, rows // FORK_MIN_ROWS - 1))


class StatQueue:
    """Size-mode checks of ``units``, taken from a pipe by forked workers and this process
    (see the module's docstring). The pipe holds batch numbers: consecutive units packed
    to :func:`unit_rows` rows, so that many small distributions cost few numbers."""

    def __init__(self, units: list[Unit]) -> None:
        self.units = units
        size = unit_rows(sum(u[4] for u in units))
        self.batches: list[list[int]] = [[]]
        rows = 0
        for number, unit in enumerate(units):
            self.batches[-1].append(number)
            rows += unit[4]
            if rows >= size:
                self.batches.append([])
                rows = 0
        if not self.batches[-1]:
            self.batches.pop()
        if len(self.batches) > MAX_BATCHES:
            raise ValueError(f"{len(self.batches)} batches: units of more rows are needed")
        read_fd, write_fd = os.pipe()
        try:
            os.write(write_fd, b"".join(i.to_bytes(4, "little")
                                        for i in range(len(self.batches))))
        finally:
            os.close(write_fd)
        os.set_blocking(read_fd, False)
        self._fd: int | None = read_fd
        self.workers: list[Forked] = []

    def fork(self, count: int) -> None:
        """Start ``count`` workers (fewer if a fork fails: this process does their part)."""
        for _ in range(count):
            try:
                self.workers.append(Forked(self._work))
            except OSError:
                return

    def _take(self) -> list[int] | None:
        """The unit numbers of the next batch; None when the pipe is empty (all numbers were
        written before any worker started, 4 bytes each, so a read never splits one)."""
        if self._fd is None:
            return None
        try:
            data = os.read(self._fd, 4)
        except BlockingIOError:
            return None
        return self.batches[int.from_bytes(data, "little")] if len(data) == 4 else None

    def _work(self) -> list[tuple[int, tuple[object, ...]]]:
        """A worker's life: check batches until none is left; the answers as plain data."""
        done: list[tuple[int, tuple[object, ...]]] = []
        while (batch := self._take()) is not None:
            done.extend((n, encode(check_unit(self.units[n]))) for n in batch)
        return done

    def finish(self, wanted: Collection[int]) -> dict[int, Checked]:
        """Check the batches left in the pipe, gather the workers' answers, check again any
        unit a failed worker took; the results of the ``wanted`` units by number."""
        results: dict[int, Checked] = {}
        try:
            while (batch := self._take()) is not None:
                for number in batch:
                    if number in wanted:
                        results[number] = check_unit(self.units[number])
            for worker in self.workers:
                answer = worker.result()
                for item in answer if isinstance(answer, list) else ():
                    try:
                        number, data = item
                        if number in wanted and number not in results:
                            results[number] = decode(data)
                    except (TypeError, ValueError):
                        continue
            for number in wanted:
                if number not in results:
                    results[number] = check_unit(self.units[number])
        except BaseException:
            self.abandon()
            raise
        self._close()
        return results

    def abandon(self) -> None:
        """Kill and reap the workers (an interrupted caller, or nobody took the queue)."""
        for worker in self.workers:
            worker.abandon()
        self._close()

    def _close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class Ahead:
    """A records memo, loaded early, and the stat work started on its rows (``queue`` is
    None when there was too little to fork for)."""

    def __init__(self, memo: RecordMemo) -> None:
        self.memo = memo
        self.queue: StatQueue | None = None
        self._units: dict[str, tuple[int | None, range]] = {}
        found = [f for f in memo.folder_records() if f[1].count]
        workers = worker_count(sum(rows.count for _, rows, _ in found))
        if not workers:
            return
        units: list[Unit] = []
        for meta_dir, rows, installed_ns in found:
            first = len(units)
            units.extend(units_of(os.path.dirname(meta_dir), rows, installed_ns))
            self._units[meta_dir] = (installed_ns, range(first, len(units)))
        self.queue = StatQueue(units)
        self.queue.fork(workers)

    def units_for(self, meta_dir: str, installed_ns: int | None, *,
                  from_memo: bool) -> range | None:
        """The numbers of the units that check the dist-info folder ``meta_dir``'s rows, for
        a distribution the scan read from this memo (``from_memo``: the folder's entry, so
        its rows, are the ones the units were made of) with the same RECORD time; else
        None."""
        known = self._units.get(meta_dir) if from_memo and self.queue is not None else None
        if known is None or known[0] != installed_ns:
            return None
        return known[1]

    def abandon(self) -> None:
        if self.queue is not None:
            self.queue.abandon()


_STARTED: list[Ahead] = []


def start(prefix: str, memo_root: Path) -> None:
    """Start stat-ing ahead for the environment at ``prefix``, whose memo files are under
    ``memo_root`` (a no-op where one was started for it, or forking is not safe). A command
    calls this as soon as it knows its environment; never raises."""
    path = RecordMemo.for_prefix_path(prefix, memo_root)
    if any(a.memo.path == path for a in _STARTED) or not fork_is_safe():
        return
    try:
        _STARTED.append(Ahead(RecordMemo(path)))
    except (OSError, ValueError):
        return


def take(prefix: str, memo_root: Path) -> Ahead | None:
    """The :class:`Ahead` started for ``prefix`` and ``memo_root``, now the caller's (it must
    finish or abandon its queue); None if there is none. Others started are abandoned."""
    path = RecordMemo.for_prefix_path(prefix, memo_root)
    found = None
    while _STARTED:
        ahead = _STARTED.pop()
        if ahead.memo.path == path and found is None:
            found = ahead
        else:
            ahead.abandon()
    return found


@atexit.register
def _abandon_started() -> None:
    """At exit: end the workers nobody took (the command failed before it collected)."""
    while _STARTED:
        _STARTED.pop().abandon()
