"""dflash-train's environment gate: does this interpreter's environment match
``lockfiles/dflash-train.toml``?

Launched through ``envguard run`` the command trusts the check that already happened
(``ENVGUARD_VERIFIED`` names this lock), and keeps the snapshot it handed over
(:func:`envguard.gate.launch.handed_over`); launched directly it runs the same check itself
(:func:`envguard.gate.check_command`). Under torchrun every rank checks itself and any
drifted rank stops all of them, before any training collective, so nobody waits forever.
"""

from __future__ import annotations

import hashlib
import os
import time
from dataclasses import dataclass, field
from typing import Any

from dflash.distributed.world import World, gather_gate
from dflash.errors import InputError, RefusedError
from envguard.probe.background import Forked, fork_is_safe

LOCK_NAME = "dflash-train"


@dataclass(frozen=True, slots=True)
class Gate:
    passed: bool
    findings: list[str]
    """``[rule] title`` of each mismatch (``rank R: ...`` under torchrun)."""
    how: str
    """How it was checked, for metadata.json: ``checked LOCK`` or ``verified by ...``."""
    snapshot_json: str | None = None
    """The snapshot the gate took (``env.json`` of the run folder), when there is one."""
    seconds: dict[str, float] = field(default_factory=dict)
    """How long the check took, beside what (:class:`PendingGate`): metadata's ``gate_s``."""

    @property
    def snapshot_sha256(self) -> str | None:
        """``sha256:<hex>`` of :attr:`snapshot_json`: what checkpoints name."""
        if self.snapshot_json is None:
            return None
        return "sha256:" + hashlib.sha256(self.snapshot_json.encode()).hexdigest()

    def share_compat_key(self) -> None:
        """Hand the snapshot's compile-compat key to the Mega-Cache, which would otherwise
        take a second snapshot in the drafter's placing (torch is imported by now)."""
        if self.snapshot_json is not None:
            from dflash.compilation.megacache import use_compat_key_of

            use_compat_key_of(self.snapshot_json)


def verify_environment() -> Gate:
    """The gate for this interpreter's environment."""
    from envguard.gate import check_command
    from envguard.gate.launch import handed_over

    handed = handed_over(LOCK_NAME)
    if handed is not None:
        return Gate(True, [], f"verified by envguard run ({handed.verified})",
                    handed.snapshot_json)
    result = check_command(LOCK_NAME)
    mismatch = [] if result.passed else [f"[{f.rule}] {f.title}" for f in result.findings]
    return Gate(result.passed, mismatch, f"checked {result.lock_path}",
                result.snapshot.to_json())


def check_gate(world: World) -> Gate:
    """:func:`verify_environment`; a gate that cannot run is bad input for one process,
    and a failed gate under torchrun (every rank must still reach the gather)."""
    try:
        return verify_environment()
    except Exception as exc:  # noqa: BLE001 - the gate's own errors are one line too
        return _cannot_check(world, str(exc))


def _cannot_check(world: World, why: str) -> Gate:
    if not world.distributed:
        raise InputError(f"cannot check the environment: {why}") from None
    return Gate(False, [f"cannot check the environment: {why}"], "failed")


def _gate_in_child() -> tuple[Any, ...]:
    """:func:`verify_environment` as plain data, for :class:`Forked`'s pipe."""
    start = time.perf_counter()
    try:
        gate = verify_environment()
    except Exception as exc:  # noqa: BLE001 - handed back, reported as check_gate does
        return ("error", str(exc))
    return ("gate", gate.passed, gate.findings, gate.how, gate.snapshot_json,
            time.perf_counter() - start)


@dataclass(slots=True)
class PendingGate:
    """:func:`check_gate` running in a forked child while the launch imports torch.

    The gate reads thousands of files (0.3 s on a warm GPU host, 1.2-5 s on a newly
    started one) and torch's import is as long or longer (1.1-1.4 s, 4-7 s); neither
    needs the other, and a fork made before torch is loaded runs them side by side.
    Nothing is trained, compiled or written before :meth:`result` answers. Where a fork
    is not safe (another thread, not Linux) or the child fails, the gate runs here, in
    :meth:`result`.
    """

    world: World
    child: Forked | None
    seconds: dict[str, float] = field(default_factory=dict)
    """``gate``: how long the check took; ``waited``: how long :meth:`result` waited
    for it (0 when torch's import was the longer); for metadata.json."""

    def result(self) -> Gate:
        child, self.child = self.child, None
        start = time.perf_counter()
        answer = child.result() if child is not None else None
        waited = time.perf_counter() - start
        if isinstance(answer, tuple) and len(answer) == 6 and answer[0] == "gate":
            _, passed, findings, how, snapshot_json, seconds = answer
            self.seconds = {"gate": round(float(seconds), 3), "waited": round(waited, 3)}
            return Gate(bool(passed), list(findings), str(how), snapshot_json)
        if isinstance(answer, tuple) and len(answer) == 2 and answer[0] == "error":
            return _cannot_check(self.world, str(answer[1]))
        gate = check_gate(self.world)
        took = round(time.perf_counter() - start, 3)
        self.seconds = {"gate": took, "waited": took}
        return gate

    def abandon(self) -> None:
        """Stop the child if :meth:`result` was never asked (an interrupted launch)."""
        child, self.child = self.child, None
        if child is not None:
            child.abandon()


def start_gate(world: World) -> PendingGate:
    """The gate, started: in a forked child where that is safe, else when asked."""
    if os.environ.get("ENVGUARD_VERIFIED") or not fork_is_safe():
        return PendingGate(world, None)  # handed over by envguard run: nothing to overlap
    try:
        return PendingGate(world, Forked(_gate_in_child))
    except OSError:
        return PendingGate(world, None)


def refuse(gate: Gate) -> RefusedError:
    """The refusal of one process: its findings, then why it stops."""
    return RefusedError("\n".join([
        *gate.findings,
        "refusing to start: the environment does not match its lock "
        "(envguard check dflash-train explains; --unguarded starts anyway)"]))


def gather(world: World, gate: Gate, unguarded: bool) -> Gate:
    """Collective: every rank's gate. RefusedError on every rank when any rank failed
    (rank 0 says which and why), unless ``unguarded``."""
    failed = gather_gate(world, gate.passed, gate.findings)
    if failed and not unguarded:
        lines: list[str] = []
        if world.is_main:
            lines = [f"rank {rank}: {line}" for rank, found in failed
                     for line in found or ["(no detail)"]]
            ranks = ", ".join(str(r) for r, _ in failed)
            lines.append(f"refusing to start: rank(s) {ranks} of {world.size} do not match "
                         "the lock (envguard check dflash-train on that node explains; "
                         "--unguarded starts anyway)")
        raise RefusedError("\n".join(lines))
    return Gate(not failed, [f"rank {r}: {x}" for r, found in failed for x in found],
                gate.how, gate.snapshot_json, gate.seconds)
