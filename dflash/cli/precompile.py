"""A new machine's first launch: compile torch's bytecode in the background, in parallel.

On an image whose torch ships no ``.pyc`` (the GPU hosts), the first ``dflash-train``
on a machine compiled the sources of dynamo, inductor and the rest of torch as it
imported them, one module at a time on the main thread: 7 s of placing the drafter and
about 8 s of the warm-up at the 8B shape, against 2-3 s each once the bytecode was kept
(``envguard.bytecode``, which :func:`dflash.cli.command.keep_bytecode` turns on).

:func:`start` launches, once per bytecode folder and torch install, a detached process
that compiles those packages into the same folder (``compileall`` with one worker per
core, dynamo and inductor first) while the launch itself imports torch, builds the target
and generates its data on the GPU; by the time the trainer imports dynamo, most of it is
bytecode already. A module both compile is written twice, atomically, with the same
bytes. A marker file says it finished; later launches start nothing, nor do launches
while one compiles (another marker: a compile killed midway leaves it, and the imports
then compile as they come, as before).
``DFLASH_NO_PRECOMPILE=1`` turns it off.

Before compiling, the same process reads torch's shared libraries and sources, the CUDA
wheels' and triton's libraries into the page cache, sixteen 32 MiB ranges or files at a
time (:func:`libraries_for`, in the order a launch loads them). A newly started cloud
machine reads a file the first time at a fraction of its later speed, one page fault
after another when the loader maps a library: there the first launch spent 14.7 s more
than a launch with every cache emptied but the page cache merely dropped
(docs/BENCHMARKS.md). The marker holds what the background process did (JSON: bytes
read, seconds).
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
from pathlib import Path

FIRST = ("_dynamo", "_inductor", "fx", "_functorch", "_subclasses", "_higher_order_ops",
         "_prims", "_refs", "_decomp", "utils", "distributed", "nn", "_library", "export",
         "_export")
"""torch's subpackages in the order the trainer needs them (the rest of torch follows)."""
ALSO = ("sympy", "triton", "mpmath", "safetensors")
"""Packages beside torch that compiling imports, compiled after it."""
SKIP = r"[/\\](test|tests|testing)[/\\]"
OPT_OUT_ENV = "DFLASH_NO_PRECOMPILE"
"""Set (non-empty): no background compile; the imports compile as they come."""

SCRIPT = """
import compileall, json, os, re, sys, time
from concurrent.futures import ThreadPoolExecutor
try:
    os.nice(10)
except OSError:
    pass
marker, skip, home, torch_root = sys.argv[1], re.compile(sys.argv[2]), sys.argv[3], sys.argv[4]
dirs = sys.argv[5:]
sys.path.insert(0, home)  # the folder that holds dflash: the list is made here, not in the launch
from pathlib import Path
from dflash.cli.precompile import libraries_for
libraries = libraries_for(Path(torch_root))
CHUNK = 32 << 20
def ranges():
    for path in libraries:
        try:
            size = os.stat(path).st_size
        except OSError:
            continue
        for start in range(0, size, CHUNK):
            yield path, start
def read(job):
    path, start = job
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return 0
    try:
        done = 0
        while done < CHUNK:
            got = len(os.pread(fd, min(8 << 20, CHUNK - done), start + done))
            if not got:
                break
            done += got
        return done
    except OSError:
        return 0
    finally:
        os.close(fd)
t0 = time.monotonic()
with ThreadPoolExecutor(16) as pool:
    read_bytes = sum(pool.map(read, ranges()))
t1 = time.monotonic()
ok = True
for d in dirs:
    ok &= bool(compileall.compile_dir(d, quiet=2, workers=0, rx=skip))
if ok:
    with open(marker, "w") as fh:
        json.dump({"read_bytes": read_bytes, "read_s": round(t1 - t0, 3),
                   "compile_s": round(time.monotonic() - t1, 3)}, fh)
os.remove(marker + ".running")
"""


def marker_for(folder: Path, torch_root: Path) -> Path:
    """The file that says ``torch_root``'s tree was compiled into ``folder``."""
    key = hashlib.sha256(str(torch_root.resolve()).encode()).hexdigest()[:16]
    return folder / f"precompiled-{key}"


def dirs_for(torch_root: Path) -> list[Path]:
    """What to compile: torch's subpackages in :data:`FIRST` order, then torch's own
    folder (the rest), then the :data:`ALSO` packages found beside it."""
    first = [torch_root / name for name in FIRST if (torch_root / name).is_dir()]
    also = [torch_root.parent / name for name in ALSO if (torch_root.parent / name).is_dir()]
    return [*first, torch_root, *also]


LIBRARIES_FIRST = ("cuda_runtime", "cublas", "cudnn", "nccl", "cuda_nvrtc", "nvjitlink")
"""The CUDA wheels a launch uses first (the runtime, matmuls, attention, collectives,
triton's linking); the other ``nvidia`` wheels follow."""


def libraries_for(torch_root: Path) -> list[Path]:
    """What to read ahead, in the order a launch needs it: torch's shared libraries, its
    Python sources (outside tests), the CUDA wheels' libraries beside it
    (:data:`LIBRARIES_FIRST` first), then triton's (with its ``ptxas``)."""
    site = torch_root.parent
    skip = re.compile(SKIP)

    def found(folder: Path, python: bool = False) -> list[Path]:
        if not folder.is_dir():
            return []
        return sorted(p for p in folder.rglob("*")
                      if (p.suffix == ".py" if python else
                          ".so" in p.name or p.parent.name == "bin")
                      and not skip.search(str(p.relative_to(site))) and p.is_file()
                      and not p.is_symlink())

    nvidia = sorted(p for p in (site / "nvidia").glob("*") if p.is_dir()) if (
        site / "nvidia").is_dir() else []
    rank = {name: i for i, name in enumerate(LIBRARIES_FIRST)}
    nvidia.sort(key=lambda p: (rank.get(p.name, len(rank)), p.name))
    return [*found(torch_root / "lib"), *found(torch_root, python=True),
            *(f for p in nvidia for f in found(p)), *found(site / "triton")]


def start(folder: Path, torch_root: Path, *, wait: bool = False) -> subprocess.Popen[bytes] | None:
    """Compile ``torch_root``'s tree (and :data:`ALSO`) into the bytecode ``folder`` in a
    detached process, unless its marker is there; the process, or None. ``wait`` (tests)
    waits for it."""
    marker = marker_for(folder, torch_root)
    if marker.exists() or not torch_root.is_dir() or os.environ.get(OPT_OUT_ENV):
        return None
    try:  # one compile at a time (torchrun's ranks all launch at once)
        os.close(os.open(f"{marker}.running", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    except OSError:
        return None
    home = Path(__file__).resolve().parents[2]  # what holds the dflash package
    argv = [sys.executable, "-X", f"pycache_prefix={folder}", "-c", SCRIPT, str(marker), SKIP,
            str(home), str(torch_root), *(str(d) for d in dirs_for(torch_root))]
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True,
                            env={**os.environ, "PYTHONDONTWRITEBYTECODE": ""})
    if wait:
        proc.wait()
    return proc
