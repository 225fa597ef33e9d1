"""The heavy imports without the cyclic collector (dflash.compilation.imports), in a fresh
interpreter each: the collector is off inside, frozen and back after, also on an error."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run(body: str) -> list[str]:
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(body)], cwd=REPO,
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split()


def test_the_collector_is_off_inside_then_frozen_and_back() -> None:
    assert run("""
        import gc
        from dflash.compilation.imports import without_collection
        before = gc.get_freeze_count()
        with without_collection():
            print(gc.isenabled())
            kept = [[] for _ in range(1000)]
        print(gc.isenabled(), gc.get_freeze_count() >= before + 1000)
        try:
            with without_collection():
                raise KeyError("x")
        except KeyError:
            print(gc.isenabled())
        gc.disable()
        with without_collection():
            pass
        print(gc.isenabled())  # a collector the caller had turned off stays off
    """) == ["False", "True", "True", "True", "False"]


def test_import_torch_and_the_compiler_leave_the_collector_on() -> None:
    assert run("""
        import gc, sys
        from dflash.compilation.imports import import_compiler, import_torch
        import_torch()
        import_compiler()
        print(gc.isenabled(), "torch._dynamo" in sys.modules,
              "torch._inductor.compile_fx" in sys.modules, gc.get_freeze_count() > 100000)
    """) == ["True", "True", "True", "True"]
