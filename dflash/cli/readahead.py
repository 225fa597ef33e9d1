"""A new machine's first launch: read what the launch will read, many files at once.

On a newly started GPU host the first ``dflash-train`` spent 9 s before its target
(against 1.7 s on the same host's next launch with every dflash, compile and envguard
folder new) and 7 s placing the drafter (1.8 s), the import of dynamo and inductor
(docs/BENCHMARKS.md, issue 36). Nothing about those seconds is computing: a launch on a
host that had run before, its page cache, dentries and inodes dropped, does not pay them,
and touching the host's memory for the first time costs nothing measurable (20 GiB/s in
the first round, 24 after). What is left is the disk: a new machine reads each block the
first time from storage far slower than any later read. Python's imports read a few
thousand small files one after another, each paying that first-read latency in turn.

:func:`read_ahead` reads them at once, from many threads, as the launch starts: first the
sources (the interpreter's standard library, torch's and those of the packages a launch
imports beside it, :data:`PACKAGES`, then dflash's and envguard's; 48 files at a time,
0.3 s on a new H100), then the shared libraries whole, in ranges
(:func:`dflash.cli.precompile.libraries_for`, the most-read first), while the bytecode
compile runs. Each thread waits on the disk, not on the interpreter, so the reads
overlap; the launch's own imports then find the files in the page cache. Reading the
sources and the libraries at once, or only the libraries' loader parts, or no libraries,
measured slower (BENCHMARKS.md, issue 36, eighth run: 22.6 s against 22.8-28.6 s). It runs
in :mod:`dflash.cli.precompile`'s detached background process, once per machine.
"""

from __future__ import annotations

import os
import queue
import stat
import sysconfig
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from envguard.probe.background import Task, parallel_map

PACKAGES = ("sympy", "mpmath", "triton", "numpy", "jinja2", "markupsafe", "networkx",
            "filelock", "fsspec", "rich", "tqdm", "psutil", "torchgen", "safetensors",
            "packaging", "typing_extensions.py")
"""What a launch imports beside torch (a tiny launch's ``sys.modules``; inductor's
templates, partitioner and caches on a GPU add jinja2, networkx, filelock)."""
SKIP_DIRS = frozenset({"test", "tests", "testing", "include", "__pycache__", "idlelib",
                       "tkinter", "turtledemo", "lib2to3", "ensurepip", "site-packages",
                       "dist-packages"})
"""Folders no launch imports from: tests, C headers, the standard library's GUI and
tooling, and (under the standard library's folder) other environments' packages."""
SOURCES = (".py", ".pyc", ".json")
SMALL = 4 << 20
CHUNK = 32 << 20


def source_roots(torch_root: Path, home: Path) -> list[Path]:
    """Where the launch's sources are, in the order it needs them: the standard
    library, torch, the :data:`PACKAGES` found beside it, then dflash and envguard in
    ``home`` (the folder that holds them)."""
    site = torch_root.parent
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    beside = [site / name for name in PACKAGES]
    ours = [home / "dflash", home / "envguard"]
    return [p for p in (stdlib, torch_root, *beside, *ours) if p.exists()]


class _Counter:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.files = 0
        self.bytes = 0

    def add(self, n: int) -> None:
        with self.lock:
            self.files += 1
            self.bytes += n


def _open_file(path: str) -> int | None:
    """A descriptor of the regular file at ``path`` (no symlink followed, never blocking on
    a FIFO or a device), or None."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            return fd
    except OSError:
        pass
    os.close(fd)
    return None


def _read_whole(path: str, counter: _Counter) -> None:
    fd = _open_file(path)
    if fd is None:
        return
    try:
        n = len(os.read(fd, SMALL))
    except OSError:
        return
    finally:
        os.close(fd)
    counter.add(n)


def read_sources(roots: Iterable[Path], threads: int = 48) -> tuple[int, int]:
    """Walk ``roots`` and read every small source file, ``threads`` at a time (a
    breadth-first walk: each folder's files before its subfolders'); (files, bytes)."""
    todo: queue.SimpleQueue[tuple[bool, str] | None] = queue.SimpleQueue()
    pending = [0]
    lock = threading.Lock()
    finished = threading.Event()
    counter = _Counter()

    def put(is_dir: bool, path: str) -> None:
        with lock:
            pending[0] += 1
        todo.put((is_dir, path))

    def done() -> None:
        with lock:
            pending[0] -= 1
            if pending[0] == 0:
                finished.set()

    def work() -> None:
        while (item := todo.get()) is not None:
            is_dir, path = item
            try:
                if not is_dir:
                    _read_whole(path, counter)
                    continue
                with os.scandir(path) as entries:
                    for entry in entries:
                        if entry.is_dir(follow_symlinks=False):
                            if entry.name not in SKIP_DIRS:
                                put(True, entry.path)
                        elif (entry.name.endswith(SOURCES)
                              and entry.is_file(follow_symlinks=False)):
                            put(False, entry.path)
            except OSError:
                pass
            finally:
                done()

    for root in roots:
        if root.is_dir():
            put(True, str(root))
        elif root.is_file():
            put(False, str(root))
    if not pending[0]:
        return 0, 0
    workers = [threading.Thread(target=work, daemon=True) for _ in range(threads)]
    for w in workers:
        w.start()
    finished.wait()
    for _ in workers:
        todo.put(None)
    for w in workers:
        w.join()
    return counter.files, counter.bytes


def _read_range(job: tuple[str, int, int]) -> int:
    path, start, length = job
    fd = _open_file(path)
    if fd is None:
        return 0
    got = 0
    try:
        while got < length:
            n = len(os.pread(fd, min(8 << 20, length - got), start + got))
            if not n:
                break
            got += n
    except OSError:
        pass
    finally:
        os.close(fd)
    return got


def read_libraries(libraries: Iterable[Path], threads: int = 16) -> int:
    """Read ``libraries`` whole, in order, in 32 MiB ranges, ``threads`` ranges at a time;
    bytes read."""
    jobs: list[tuple[str, int, int]] = []
    for path in libraries:
        try:
            size = os.stat(path, follow_symlinks=False).st_size
        except OSError:
            continue
        jobs += [(str(path), start, min(CHUNK, size - start))
                 for start in range(0, size, CHUNK)]
    return sum(parallel_map(_read_range, jobs, threads))


def read_ahead(sources: list[Path], libraries: list[Path],
               meanwhile: Callable[[], object] | None = None) -> dict[str, float]:
    """The sources first (small files, latency-bound: nothing else on the disk then), then
    the libraries on their own threads while ``meanwhile()`` (the bytecode compile, which
    waits on the CPUs, not the disk) runs here; what was read and how long each took."""
    t0 = time.monotonic()
    files, nbytes = read_sources(sources)
    result: dict[str, float] = {"sources_files": files, "sources_bytes": nbytes,
                                "sources_s": round(time.monotonic() - t0, 3)}

    def libs() -> tuple[int, float]:
        return read_libraries(libraries), round(time.monotonic() - t0, 3)

    side = Task(libs)
    if meanwhile is not None:
        meanwhile()
        result["meanwhile_s"] = round(time.monotonic() - t0, 3)
    result["libraries_bytes"], result["libraries_s"] = side.result()
    return result
