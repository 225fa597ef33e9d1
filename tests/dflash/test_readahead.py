"""What a new machine's first launch reads ahead (dflash.cli.readahead): the loader's part of
each shared library, the sources, and bad files that must be skipped, never fatal."""

from __future__ import annotations

import _ctypes
import os
from pathlib import Path

from dflash.cli import readahead

LIBRARY = Path(_ctypes.__file__)  # a real ELF shared object on every Linux CPython


def test_fifos_folders_and_symlinks_are_skipped(tmp_path: Path) -> None:
    """Never opened for reading: a FIFO would block, a device never end, a symlink lead
    anywhere."""
    fifo = tmp_path / "lib.so"
    os.mkfifo(fifo)
    (tmp_path / "dir.so").mkdir()
    (tmp_path / "zero.so").symlink_to("/dev/zero")
    big = tmp_path / "big.so"
    big.write_bytes(b"\1" * 100)
    (tmp_path / "link.so").symlink_to(big)
    assert readahead.read_libraries([fifo, tmp_path / "dir.so", tmp_path / "zero.so",
                                     tmp_path / "link.so", big]) == 100
    (tmp_path / "pkg").mkdir()
    os.mkfifo(tmp_path / "pkg" / "x.py")
    (tmp_path / "pkg" / "y.py").write_text("Y = 1\n")
    assert readahead.read_sources([tmp_path / "pkg"]) == (1, 6)
    (tmp_path / "pkg" / "z.py").symlink_to("/dev/zero")
    assert readahead.read_sources([tmp_path / "pkg"]) == (1, 6)


def test_read_libraries_reads_every_byte_in_ranges(tmp_path: Path) -> None:
    whole = tmp_path / "whole.so"
    whole.write_bytes(b"\1" * ((32 << 20) + 5))  # two ranges
    assert readahead.read_libraries([whole, tmp_path / "missing.so"]) == (32 << 20) + 5


def test_source_roots_skip_what_a_launch_never_imports(tmp_path: Path) -> None:
    site = tmp_path / "site"
    for rel in ("torch/__init__.py", "torch/include/x.h", "torch/tests/test_a.py",
                "sympy/__init__.py", "numpy/core/data.json"):
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_text("x")
    home = tmp_path / "home"
    (home / "dflash").mkdir(parents=True)
    (home / "dflash" / "a.py").write_text("A = 1\n")
    roots = readahead.source_roots(site / "torch", home)
    assert roots[1:] == [site / "torch", site / "sympy", site / "numpy", home / "dflash"]
    files, _ = readahead.read_sources(roots[1:])
    assert files == 4  # torch/__init__, sympy/__init__, numpy's json, dflash/a.py
