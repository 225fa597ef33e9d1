#!/usr/bin/env python3
"""What ``stat`` costs on this machine: the floor under ``envguard snapshot --verify size``.

    python benchmarks/stat_floor.py SITE_PACKAGES [--reps 5]

The default snapshot stats every file a RECORD lists; nothing cheaper tells a file's size
and mtime. This times, over every file under SITE_PACKAGES, single-threaded, best of
``--reps``: ``os.stat`` of each path; ``os.stat`` relative to an open folder (``dir_fd``);
``os.lstat``; the same number of ``os.stat`` calls on ONE warm file (the system call's own
cost, no path walk); and listing every folder (``os.listdir``, what a check without sizes
would need). Prints one JSON document. Stdlib only.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from collections.abc import Callable


def _files(root: str) -> dict[str, list[str]]:
    by_folder: dict[str, list[str]] = {}
    for folder, _, names in os.walk(root):
        by_folder[folder] = names
    return by_folder


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("site_packages")
    p.add_argument("--reps", type=int, default=5)
    args = p.parse_args(argv)
    by_folder = _files(args.site_packages)
    paths = [os.path.join(folder, name) for folder, names in by_folder.items() for name in names]
    one = paths[0]

    def full() -> None:
        for path in paths:
            os.stat(path)

    def relative() -> None:
        for folder, names in by_folder.items():
            fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
            try:
                for name in names:
                    os.stat(name, dir_fd=fd)
            finally:
                os.close(fd)

    def link() -> None:
        for path in paths:
            os.lstat(path)

    def same_file() -> None:
        for _ in paths:
            os.stat(one)

    def listing() -> None:
        for folder in by_folder:
            os.listdir(folder)

    def best(fn: Callable[[], None]) -> float:
        times = []
        for _ in range(args.reps):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        return min(times)

    result: dict[str, object] = {"files": len(paths), "folders": len(by_folder),
                                 "cpus": os.cpu_count(), "python": platform.python_version()}
    for name, fn in (("stat_ms", full), ("stat_dir_fd_ms", relative), ("lstat_ms", link),
                     ("stat_one_file_ms", same_file), ("listdir_ms", listing)):
        seconds = best(fn)
        result[name] = round(seconds * 1e3, 1)
        result[name.replace("_ms", "_us_per_file")] = round(seconds / max(1, len(paths)) * 1e6, 2)
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
