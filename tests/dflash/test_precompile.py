"""The background bytecode compile of a new machine's first launch (dflash.cli.precompile):
a real subprocess compiling a real package tree into a bytecode folder."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

from dflash.cli import precompile


def _tree(root: Path) -> Path:
    """A stand-in 'torch' folder: a package with a dynamo-like subpackage and a tests
    folder, and a sibling package from ALSO."""
    torch_root = root / "site" / "torch"
    for rel in ("__init__.py", "_dynamo/__init__.py", "_dynamo/eval.py", "core.py",
                "tests/test_x.py"):
        (torch_root / rel).parent.mkdir(parents=True, exist_ok=True)
        (torch_root / rel).write_text("X = 1\n")
    (root / "site" / "sympy").mkdir()
    (root / "site" / "sympy" / "__init__.py").write_text("Y = 2\n")
    for rel, size in (("torch/lib/libtorch_cpu.so", 40 << 20),
                      ("nvidia/cufft/lib/libcufft.so.12", 10),
                      ("nvidia/cublas/lib/libcublas.so.13", 1000),
                      ("triton/_C/libtriton.so", 5), ("triton/backends/nvidia/bin/ptxas", 7)):
        (root / "site" / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / "site" / rel).write_bytes(b"\x7f" * size)
    return torch_root


def _pyc(folder: Path, source: Path) -> Path:
    """Where the interpreter looks for ``source``'s bytecode under pycache_prefix=folder."""
    old = sys.pycache_prefix
    sys.pycache_prefix = str(folder)
    try:
        return Path(importlib.util.cache_from_source(str(source)))
    finally:
        sys.pycache_prefix = old


def test_the_first_launch_compiles_the_tree_where_imports_will_look(tmp_path: Path,
                                                                    monkeypatch):
    monkeypatch.delenv(precompile.OPT_OUT_ENV, raising=False)  # the suite's conftest sets it
    torch_root = _tree(tmp_path)
    folder = tmp_path / "bytecode"
    folder.mkdir()
    assert precompile.dirs_for(torch_root)[:1] == [torch_root / "_dynamo"]
    proc = precompile.start(folder, torch_root, wait=True)
    assert proc is not None and proc.returncode == 0
    for rel in ("__init__.py", "_dynamo/eval.py", "core.py"):
        assert _pyc(folder, torch_root / rel).is_file(), rel
    assert _pyc(folder, tmp_path / "site" / "sympy" / "__init__.py").is_file()
    assert not _pyc(folder, torch_root / "tests" / "test_x.py").exists()  # tests skipped
    assert precompile.marker_for(folder, torch_root).is_file()
    assert not Path(f"{precompile.marker_for(folder, torch_root)}.running").exists()
    # Read ahead first: every byte of the libraries (a 40 MiB one in two ranges), and the
    # sources of torch (not its tests) and sympy among the rest.
    done = json.loads(precompile.marker_for(folder, torch_root).read_text())
    assert done["libraries_bytes"] == (40 << 20) + 10 + 1000 + 5 + 7, done
    assert done["sources_files"] >= 5 and done["meanwhile_s"] >= done["sources_s"], done


def test_libraries_are_read_in_the_order_a_launch_loads_them(tmp_path: Path):
    torch_root = _tree(tmp_path)
    site = tmp_path / "site"
    assert precompile.libraries_for(torch_root) == [
        site / "torch/lib/libtorch_cpu.so", site / "nvidia/cublas/lib/libcublas.so.13",
        site / "triton/_C/libtriton.so", site / "triton/backends/nvidia/bin/ptxas",
        site / "nvidia/cufft/lib/libcufft.so.12"]


def test_a_later_launch_or_the_opt_out_starts_nothing(tmp_path: Path, monkeypatch):
    torch_root = _tree(tmp_path)
    folder = tmp_path / "bytecode"
    folder.mkdir()
    monkeypatch.setenv(precompile.OPT_OUT_ENV, "1")
    assert precompile.start(folder, torch_root) is None
    monkeypatch.delenv(precompile.OPT_OUT_ENV)
    running = Path(f"{precompile.marker_for(folder, torch_root)}.running")
    running.touch()  # another launch is compiling
    assert precompile.start(folder, torch_root) is None
    running.unlink()
    precompile.marker_for(folder, torch_root).touch()
    assert precompile.start(folder, torch_root) is None
    assert not _pyc(folder, torch_root / "core.py").exists()
