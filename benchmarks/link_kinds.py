"""Hard links against symbolic links for a scratch copy's metadata, on the disk at hand.

    python benchmarks/link_kinds.py [--root DIR] [--reps 5]

Makes a venv-like tree (110 ``*.dist-info`` folders of 7 files each, as the 103-package
bench venv of ``bench_install.py`` has) under DIR, then, ``--reps`` times each and
alternating, clones its folders anew beside it the way ``envguard.install.scratch``
does (a folder made for each, each file linked) with hard links and with symbolic
links, and times each clone and its removal. Prints medians in ms.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path


def make_tree(root: Path, folders: int = 110, files: int = 7) -> Path:
    site = root / "venv" / "lib" / "python3.11" / "site-packages"
    for i in range(folders):
        meta = site / f"pkg{i:03d}-1.0.dist-info"
        meta.mkdir(parents=True)
        for j in range(files):
            (meta / f"F{j}").write_bytes(os.urandom(2000))
    return site


def clone(site: Path, dst: Path, symbolic: bool) -> float:
    started = time.perf_counter()
    dst.mkdir(parents=True)
    for meta in os.scandir(site):
        out = dst / meta.name
        os.mkdir(out)
        for f in os.scandir(meta.path):
            if symbolic:
                os.symlink(f.path, out / f.name)
            else:
                os.link(f.path, out / f.name)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", type=Path, default=None)
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="link-kinds-", dir=args.root))
    site = make_tree(root)
    times: dict[str, list[float]] = {"hard": [], "symbolic": [], "rm-hard": [],
                                     "rm-symbolic": []}
    for i in range(args.reps):
        for kind in ("hard", "symbolic"):
            dst = root / f".venv.scratch-{kind}-{i}"
            times[kind].append(clone(site, dst, kind == "symbolic"))
            started = time.perf_counter()
            shutil.rmtree(dst)
            times[f"rm-{kind}"].append(time.perf_counter() - started)
    for kind, values in times.items():
        print(f"{kind:12s} median {statistics.median(values) * 1000:7.1f} ms  "
              f"{[round(v * 1000, 1) for v in values]}")
    shutil.rmtree(root)


if __name__ == "__main__":
    main()
