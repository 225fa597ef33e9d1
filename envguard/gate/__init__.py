"""The gate: does an environment match a command's lock, and if not, why not?

- :mod:`envguard.gate.check`: compare a snapshot with every entry of a lock.
- :mod:`envguard.gate.lookup`: find and read a command's lockfile.
- :mod:`envguard.gate.command`: :func:`check_command`, the whole gate for one command,
  and :func:`gate_snapshot_options`, the one place the gate's snapshot is defined.
- :mod:`envguard.gate.launch`: the command ``envguard run`` launches (the interpreter a
  console script runs under), what it hands the child (``VERIFIED_ENV``,
  ``SNAPSHOT_ENV``), and the hand-off read back by a guarded program.
"""

from __future__ import annotations

from envguard.gate.check import EntryComparison, GateResult, check, compare
from envguard.gate.command import check_command, gate_snapshot_options
from envguard.gate.launch import SNAPSHOT_ENV, VERIFIED_ENV, interpreter_of
from envguard.gate.lookup import bundled_lock_dirs, find_lock, project_root_of, read_lock

__all__ = ["SNAPSHOT_ENV", "VERIFIED_ENV", "EntryComparison", "GateResult", "bundled_lock_dirs",
           "check",
           "check_command", "compare", "find_lock", "gate_snapshot_options", "interpreter_of",
           "project_root_of", "read_lock"]
