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


FAKE_TORCH = """\
import os, signal, time
os.kill(os.getpid(), signal.SIGINT)  # a Ctrl-C halfway through the import
time.sleep(0.05)  # Python runs signal handlers between bytecodes: here
FINISHED = True
"""


def test_a_ctrl_c_inside_the_import_is_raised_after_it(tmp_path):
    """Raised inside, a KeyboardInterrupt leaves torch half-imported (a later RecursionError,
    or an AttributeError in numpy) or is swallowed by the import machinery (the launch
    trained on); held, it comes once the import is whole. A stand-in ``torch`` package
    sends itself the SIGINT."""
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text(FAKE_TORCH)
    assert run(f"""
        import signal, sys, threading
        # Python's own handler, as in a terminal (a job started in the background of a
        # script, CI's for one, inherits SIGINT ignored, and Python leaves it so)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        sys.path.insert(0, {str(tmp_path)!r})
        from dflash.compilation.imports import import_torch, interrupt_after
        try:
            import_torch()
            print("no-interrupt")
        except KeyboardInterrupt:
            import torch
            print("interrupted-after", torch.FINISHED, "torch" in sys.modules)
        print(signal.getsignal(signal.SIGINT) is signal.default_int_handler)
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # ignored stays ignored
        with interrupt_after():
            signal.raise_signal(signal.SIGINT)
        print("ignored")
        signal.signal(signal.SIGINT, signal.default_int_handler)
        def other():
            with interrupt_after():  # not the main thread: nothing to hold, no error
                print("thread")
        t = threading.Thread(target=other)
        t.start()
        t.join()
    """) == ["interrupted-after", "True", "True", "True", "ignored", "thread"]
