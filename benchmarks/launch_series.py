"""A series of dflash-train launches on one GPU host, each timed to its first step, with what
the host did meanwhile: where a new machine's first launch loses its seconds.

    python3 benchmarks/launch_series.py --out $OUT/series --plan first,fresh,cold,warm:2 \\
        --budget 300

Each launch is :func:`first_step.first_step` at the 8B shape (``--preset``; ``--unguarded``),
its whole stderr kept (the start phases as a timeline), with ``metadata.json``'s ``gate_s`` (the
gate beside torch's import) and the change of the host's counters across it: pressure
stall time (``/proc/pressure``), page faults and pages read (``/proc/vmstat``), CPU time
by kind (``/proc/stat``), sectors read and written (``/proc/diskstats``).

The plan's steps, in order:

- ``first``: every compile, dflash and envguard folder new; on a newly started machine,
  the issue's first launch. Then the background process's marker (what it read and
  compiled, how long each took) and ``resident``: how much of each shared library is in
  the page cache (``mincore``), i.e. what the launch and the read-ahead brought in.
- ``first-profiled``: the same with ``PYTHONPROFILEIMPORTTIME=1`` (each module's import
  time in its stderr).
- ``fresh``: everything new again, on the machine as the launches before left it;
  ``fresh-serial``: the same with the data generated after the drafter's placing, not
  beside it (``DFLASH_NO_DATA_BESIDE=1``); ``fresh-warmup-beside``: the data beside the
  placing and the warm-up beside the data's end (``DFLASH_WARMUP_BESIDE=1``; the default
  waits for the data).
- ``cold``: ``first``'s compile folders emptied (the Mega-Cache store and dflash's cache
  kept); ``warm``: the same folders again.
- ``warm:N``: N rounds of three warm launches: as is, ``TORCH_WARM_POOL=0`` and
  ``TORCHINDUCTOR_COMPILE_THREADS=1`` (torch's own switches for its compile pool).

A step named again runs again, recorded as ``NAME#2`` (``fresh,fresh-warmup-beside,fresh,
fresh-warmup-beside``: an A/B in alternation). Results are written to ``OUT/series.json``
after every launch.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import ctypes.util
import importlib.util
import json
import mmap
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
FRESH: dict[str, dict[str, str] | None] = {
    "fresh": None, "fresh-serial": {"DFLASH_NO_DATA_BESIDE": "1"},
    "fresh-warmup-beside": {"DFLASH_WARMUP_BESIDE": "1"}}
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))
from first_step import first_step  # noqa: E402
from gpu_dflash import cache_env  # noqa: E402

CPU_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


def host_counters() -> dict[str, int]:
    out: dict[str, int] = {}
    for name in ("cpu", "io", "memory"):
        try:
            for line in Path(f"/proc/pressure/{name}").read_text().splitlines():
                kind, *fields = line.split()
                out[f"psi_{name}_{kind}_total_us"] = int(fields[-1].split("=")[1])
        except (OSError, IndexError, ValueError):
            pass
    try:
        vm = dict(line.split() for line in Path("/proc/vmstat").read_text().splitlines())
        out.update({k: int(vm[k]) for k in ("pgmajfault", "pgfault", "pgpgin", "pgpgout")})
    except (OSError, KeyError, ValueError):
        pass
    try:
        cpu = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
        out.update({f"cpu_{k}": int(v) for k, v in zip(CPU_FIELDS, cpu, strict=False)})
    except (OSError, IndexError, ValueError):
        pass
    try:
        read = written = 0
        for line in Path("/proc/diskstats").read_text().splitlines():
            f = line.split()
            if f[2].startswith(("loop", "ram")) or (f[2][-1].isdigit()
                                                   and not f[2].startswith("nvme")):
                continue  # whole disks only (vda, sda, nvme0n1)
            read, written = read + int(f[5]), written + int(f[9])
        out["disk_read_sectors"], out["disk_write_sectors"] = read, written
    except (OSError, IndexError, ValueError):
        pass
    return out


def resident_libraries() -> dict[str, Any]:
    """Bytes of each shared library of the read-ahead's list in the page cache."""
    from dflash.cli.precompile import libraries_for

    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    page = os.sysconf("SC_PAGE_SIZE")
    spec = importlib.util.find_spec("torch")
    assert spec is not None and spec.origin is not None
    torch_root = Path(spec.origin).parent
    rows = []
    for path in libraries_for(torch_root):
        size = path.stat().st_size
        if not size:
            continue
        fd = os.open(path, os.O_RDONLY)
        try:
            addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
            pages = (size + page - 1) // page
            vec = ctypes.create_string_buffer(pages)
            libc.mincore(ctypes.c_void_p(addr), size, vec)
            libc.munmap(ctypes.c_void_p(addr), size)
        finally:
            os.close(fd)
        rows.append((str(path.relative_to(torch_root.parent)), size,
                     sum(b & 1 for b in vec.raw) * page))
    rows.sort(key=lambda r: -r[2])
    return {"size": sum(r[1] for r in rows), "resident": sum(r[2] for r in rows),
            "libraries": rows}


class Series:
    def __init__(self, out: Path, deadline: float, preset: str) -> None:
        self.out, self.deadline, self.preset = out, deadline, preset
        self.doc: dict[str, Any] = {}
        self.base = Path(tempfile.mkdtemp(prefix="dflash-series-"))

    def save(self) -> None:
        (self.out / "series.json").write_text(json.dumps(self.doc, indent=1))

    def tools(self, root: Path) -> dict[str, str]:
        return {"DFLASH_CACHE_DIR": str(root / "dflash-cache"),
                "ENVGUARD_CACHE_DIR": str(root / "envguard-cache")}

    def launch(self, name: str, compile_root: Path, tools_root: Path,
               extra: dict[str, str] | None = None, limit: float = 120) -> None:
        if name in self.doc:  # a step run again: its own record and run folder
            name = next(f"{name}#{i}" for i in range(2, 100) if f"{name}#{i}" not in self.doc)
        left = self.deadline - time.monotonic()
        if left < 15:
            self.doc[name] = {"skipped": "time"}
            self.save()
            return
        env = {**cache_env(compile_root), **self.tools(tools_root), **(extra or {})}
        run = self.base / f"run-{name}"
        before = host_counters()
        r = first_step(self.preset, run, env, min(limit, left),
                       (f"--set=mega_cache={tools_root / 'store'}",), keep_all=True)
        after = host_counters()
        r.pop("stderr", None)
        r["env"] = extra or {}
        r["host_delta"] = {k: after[k] - before[k] for k in before if k in after}
        with contextlib.suppress(OSError, ValueError):
            r["gate_s"] = json.loads((run / "metadata.json").read_text()).get("gate_s")
        self.doc[name] = r
        self.save()
        print(name, r.get("first_step_s"), r.get("start_s"), r.get("error"), flush=True)

    def markers(self) -> dict[str, Any]:
        found: dict[str, Any] = {}
        for f in sorted(self.base.glob("**/bytecode/precompiled-*")):
            try:
                found[f.name] = json.loads(f.read_text() or "null")
            except ValueError as exc:
                found[f.name] = str(exc)
        return found

    def step(self, step: str) -> None:
        name, _, count = step.partition(":")
        if name in ("first", "first-profiled"):
            extra = {"PYTHONPROFILEIMPORTTIME": "1"} if name == "first-profiled" else None
            self.launch("first", self.base / "a", self.base, extra, limit=150)
            self.doc["first_background"] = self.markers()
            self.doc["first_resident"] = resident_libraries()
            self.save()
        elif name in FRESH:
            root = Path(tempfile.mkdtemp(prefix="dflash-series-fresh-"))
            extra = FRESH[name]
            self.launch(name, root / "compile", root, extra, limit=120)
        elif name == "cold":
            shutil.rmtree(self.base / "b", ignore_errors=True)
            self.launch("cold", self.base / "b", self.base, limit=90)
        elif name == "warm":
            for i in range(int(count or 0) or 1):
                for label, extra in (("", None), ("-pool0", {"TORCH_WARM_POOL": "0"}),
                                     ("-threads1", {"TORCHINDUCTOR_COMPILE_THREADS": "1"})):
                    if count or not label:
                        self.launch(f"warm{label}-{i}", self.base / "b", self.base, extra, 60)
        else:
            raise SystemExit(f"unknown step {step!r}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--plan", default="first,fresh,cold,warm")
    p.add_argument("--budget", type=float, default=300.0, help="seconds for the series")
    p.add_argument("--preset", default="qwen3-8b-shape",
                   help="dflash-train's preset (tiny: a CPU smoke run of the series)")
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    series = Series(args.out, time.monotonic() + args.budget, args.preset)
    for step in args.plan.split(","):
        series.step(step)
    series.doc["background_end"] = series.markers()
    series.save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
