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

The same process first reads what the launch is about to read, many files at once
(:mod:`dflash.cli.readahead`: the sources of the standard library, torch and the packages
beside it, then the shared libraries of :func:`libraries_for` while it compiles): a newly
started cloud machine reads each block the first time far slower than ever after, and
Python's imports read thousands of small files one after another. The final marker holds
what was read and compiled, and how long each took (JSON).
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
marker, skip, home, torch_root = sys.argv[1], re.compile(sys.argv[2]), sys.argv[3], sys.argv[4]
dirs = sys.argv[5:]
sys.path.insert(0, home)  # the folder that holds dflash: the lists are made here, not in the launch
from pathlib import Path
from dflash.cli.precompile import libraries_for
from dflash.cli.readahead import read_ahead, source_roots
ok = True
def compile_all():
    global ok
    try:
        os.nice(10)
    except OSError:
        pass
    for d in dirs:
        ok &= bool(compileall.compile_dir(d, quiet=2, workers=0, rx=skip))
done = read_ahead(source_roots(Path(torch_root), Path(home)), libraries_for(Path(torch_root)),
                  meanwhile=compile_all)
if ok:
    with open(marker, "w") as fh:
        json.dump(done, fh)
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


USED_FIRST = ("libcublasLt.", "libcublas.", "libnvrtc.", "libnvrtc-builtins.", "libnvJitLink.",
              "libcudnn.", "libcudnn_graph.", "libcudnn_heuristic.",
              "libcudnn_engines_runtime_compiled.", "libcupti.", "libtriton.", "ptxas")
"""The libraries (by name) a launch reads most of, beside torch's own: on a new H100 whose
libraries nobody had read, a first launch's pages of each (``mincore`` after its first
step) were all of triton's, ``nvrtc`` and ``ptxas``, and 40-85 % of these others, against
a few MB of the FFT, sparse, solver, random, NCCL and precompiled cuDNN engine libraries
it also loads (docs/BENCHMARKS.md). Those follow, still whole, last."""


def libraries_for(torch_root: Path) -> list[Path]:
    """The shared libraries to read ahead, in the order a launch needs them: torch's, then
    the CUDA wheels' and triton's of :data:`USED_FIRST`, then the rest of both. The
    sources are :func:`dflash.cli.readahead.source_roots`'s."""
    site = torch_root.parent
    skip = re.compile(SKIP)

    def found(folder: Path) -> list[Path]:
        if not folder.is_dir():
            return []
        return sorted(p for p in folder.rglob("*")
                      if (".so" in p.name or p.parent.name == "bin")
                      and not skip.search(str(p.relative_to(site))) and p.is_file()
                      and not p.is_symlink())

    def used_first(path: Path) -> bool:
        return path.name.startswith(USED_FIRST) or path.name == "ptxas"

    others = [*found(site / "nvidia"), *found(site / "triton")]
    return [*found(torch_root / "lib"), *(p for p in others if used_first(p)),
            *(p for p in others if not used_first(p))]


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
