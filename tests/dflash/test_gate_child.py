"""dflash-train's gate runs in a forked child while the launch imports torch
(:class:`dflash.cli.gate.PendingGate`).

Each case runs in a fresh interpreter: the fork is made only from a process with no other
thread, and this one (pytest, torch) has several. The gate itself is replaced by a small
function in those interpreters: what is tested is where it runs and what comes back.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

HEADER = textwrap.dedent("""
    import json, os, sys, threading, time
    import dflash.cli.gate as g
    from dflash.distributed.world import World
    PARENT = os.getpid()
    WORLD = World(rank=0, local_rank=0, size=1)
    def report(gate):
        print(json.dumps({"passed": gate.passed, "findings": gate.findings, "how": gate.how,
                          "snapshot": gate.snapshot_json, "parent": PARENT}))
""")


def run(*parts: str, env: dict[str, str] | None = None,
        timeout: float = 60) -> subprocess.CompletedProcess[str]:
    import os

    script = HEADER + "".join(textwrap.dedent(part) for part in parts)
    return subprocess.run([sys.executable, "-c", script], cwd=REPO,
                          env={**os.environ, **(env or {})}, capture_output=True, text=True,
                          timeout=timeout, check=False)


def answer(proc: subprocess.CompletedProcess[str]) -> dict[str, object]:
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


FAKE_GATE = """
    def fake():
        return g.Gate(True, ["[rule] a finding"], f"pid {os.getpid()}", '{"x": 1}')
    g.verify_environment = fake
"""


def test_the_gate_runs_in_a_child_and_its_answer_comes_back_whole() -> None:
    got = answer(run(FAKE_GATE, """
        pending = g.start_gate(WORLD)
        assert pending.child is not None
        report(pending.result())
    """))
    assert got["passed"] is True and got["findings"] == ["[rule] a finding"]
    assert got["snapshot"] == '{"x": 1}'
    assert got["how"] != f"pid {got['parent']}"  # another process computed it


def test_no_fork_with_another_thread_or_a_handed_over_check() -> None:
    threaded = answer(run(FAKE_GATE, """
        threading.Thread(target=time.sleep, args=(3,), daemon=True).start()
        pending = g.start_gate(WORLD)
        assert pending.child is None
        report(pending.result())
    """))
    assert threaded["how"] == f"pid {threaded['parent']}"
    handed = answer(run(FAKE_GATE, """
        pending = g.start_gate(WORLD)
        assert pending.child is None
        report(pending.result())
    """, env={"ENVGUARD_VERIFIED": "dflash-train:x:y"}))
    assert handed["how"] == f"pid {handed['parent']}"


def test_a_gate_that_cannot_run_is_the_same_one_line_error_as_in_process() -> None:
    proc = run("""
        def broken():
            raise OSError("lockfiles/dflash-train.toml: cannot read")
        g.verify_environment = broken
        from dflash.errors import InputError
        for how in ("child", "here"):
            pending = g.start_gate(WORLD) if how == "child" else g.PendingGate(WORLD, None)
            try:
                pending.result()
            except InputError as exc:
                print(how, exc)
        torchrun = g.start_gate(World(rank=1, local_rank=1, size=2)).result()
        print(torchrun.passed, torchrun.findings)
    """)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    message = "cannot check the environment: lockfiles/dflash-train.toml: cannot read"
    assert lines[:2] == [f"child {message}", f"here {message}"]
    assert lines[2] == f"False ['{message}']"


def test_a_child_that_dies_is_replaced_by_the_gate_run_here() -> None:
    got = answer(run("""
        def dies():
            if os.getpid() != PARENT:
                os.kill(os.getpid(), 9)
            return g.Gate(True, [], f"pid {os.getpid()}", None)
        g.verify_environment = dies
        report(g.start_gate(WORLD).result())
    """))
    assert got["how"] == f"pid {got['parent']}"


def test_an_abandoned_gate_stops_its_child() -> None:
    proc = run("""
        def hangs():
            time.sleep(120)
        g.verify_environment = hangs
        pending = g.start_gate(WORLD)
        pid = pending.child._pid
        t0 = time.monotonic()
        pending.abandon()
        try:
            os.kill(pid, 0)
            print("alive")
        except ProcessLookupError:
            print("gone", time.monotonic() - t0 < 10)
    """, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["gone", "True"]


def test_a_torch_that_cannot_be_imported_still_hears_the_gates_refusal() -> None:
    """The launch imports torch while the gate runs; a torch that fails to import (the
    incident's kind of broken environment) must not hide the gate's findings."""
    proc = run("""
        import importlib.abc, importlib.util
        class Broken(importlib.abc.Loader):  # found, as an installed torch is; fails to load
            def create_module(self, spec):
                return None
            def exec_module(self, module):
                raise ImportError("libcudnn.so.9: cannot open shared object file")
        class BrokenTorch:
            def find_spec(self, name, path=None, target=None):
                if name == "torch":
                    return importlib.util.spec_from_loader(name, Broken())
                return None
        sys.meta_path.insert(0, BrokenTorch())
        sys.modules.pop("torch", None)
        def refused():
            return g.Gate(False, ["[torch-build-changed] torch was rebuilt"], "checked x", None)
        g.verify_environment = refused
        import dflash.cli.train as t
        import tempfile
        out = os.path.join(tempfile.mkdtemp(), "out")
        code = t.main(["--preset", "tiny", "--out", out, "--steps", "1"])
        print(sorted(os.listdir(os.path.dirname(out))))
        sys.exit(code)
    """)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "dflash-train: [torch-build-changed] torch was rebuilt" in proc.stderr
    assert "refusing to start" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "[]"  # nothing written
