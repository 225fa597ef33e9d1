"""Is a new machine slow because its memory is touched for the first time?

On a newly started GPU host a dflash first launch takes 28-44 s, about 10-15 s more
than the same launch with every dflash, compile and envguard folder new on a host that
has run before, even after that host drops its page cache, dentries and inodes
(BENCHMARKS.md, issue 36). A cost the guest cannot drop may sit below it: a virtual
machine whose memory the hypervisor backs on first touch pays a fault per page (or huge
page) the first time any process writes it, and every later process reuses pages the
guest kernel already holds.

Each round maps ``--gb`` GiB of anonymous memory with ``MAP_POPULATE`` (the kernel
faults every page in) in ``--workers`` processes at once. The first round on a new
machine touches pages nobody has touched; later rounds (after the earlier processes
exited and gave their pages back to the guest kernel) mostly reuse pages the first left
backed. A first round much slower than the next says the hypothesis holds; the command
run after them (``--then``, e.g. the start stage) says how much of a first launch it
was. A GPU passed through to a virtual machine usually needs all of the guest's memory
pinned, hence backed, from the start: there the rounds should run at one speed.

    python3 benchmarks/new_machine.py --out $OUT/touch.json --gb 32 --workers 16 \\
        --then "python3 benchmarks/gpu_dflash.py --out $OUT/start --stages start"
"""

from __future__ import annotations

import argparse
import json
import mmap
import shlex
import subprocess
import sys
import time
from pathlib import Path

PAGE = 4096
WORKER = r'''
import mmap, sys, time
size = int(sys.argv[1])
t0 = time.perf_counter()
# MAP_POPULATE: the kernel faults every page in (allocated and zeroed) before mmap
# returns, with no Python loop: the time is the kernel's and the hypervisor's alone.
m = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | mmap.MAP_POPULATE)
print(time.perf_counter() - t0)
'''


def touch_round(gib: float, workers: int) -> dict[str, float]:
    each = int(gib * (1 << 30) / workers) // PAGE * PAGE
    t0 = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, str(each)],
                              stdout=subprocess.PIPE, text=True) for _ in range(workers)]
    seconds = [float(p.communicate()[0].strip() or "nan") for p in procs]
    wall = time.perf_counter() - t0
    return {"gib": each * workers / (1 << 30), "wall_s": wall,
            "gib_per_s": each * workers / (1 << 30) / wall,
            "worker_s_max": max(seconds), "worker_s_min": min(seconds)}


def meminfo() -> dict[str, int]:
    out: dict[str, int] = {}
    try:
        for line in Path("/proc/meminfo").read_text(encoding="ascii").splitlines():
            name, _, rest = line.partition(":")
            if name in ("MemTotal", "MemFree", "MemAvailable", "Cached", "AnonHugePages"):
                out[name] = int(rest.split()[0]) // 1024  # MiB
    except OSError:
        pass
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--gb", type=float, default=32.0, help="GiB touched a round, in all")
    p.add_argument("--workers", type=int, default=16)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--then", default="", help="a command to run after the rounds, timed")
    args = p.parse_args()
    doc: dict[str, object] = {"mmap_page": mmap.PAGESIZE, "meminfo_before": meminfo(),
                              "rounds": []}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    for _ in range(args.rounds):
        doc["rounds"].append(touch_round(args.gb, args.workers))  # type: ignore[attr-defined]
        doc["meminfo_after"] = meminfo()
        args.out.write_text(json.dumps(doc, indent=1), encoding="utf-8")
    if args.then:
        t0 = time.perf_counter()
        status = subprocess.run(shlex.split(args.then), check=False).returncode
        doc["then"] = {"command": args.then, "exit": status,
                       "seconds": time.perf_counter() - t0}
        args.out.write_text(json.dumps(doc, indent=1), encoding="utf-8")
    print(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
