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
from dataclasses import dataclass

from dflash.distributed.world import World, gather_gate
from dflash.errors import InputError, RefusedError

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

    @property
    def snapshot_sha256(self) -> str | None:
        """``sha256:<hex>`` of :attr:`snapshot_json`: what checkpoints name."""
        if self.snapshot_json is None:
            return None
        return "sha256:" + hashlib.sha256(self.snapshot_json.encode()).hexdigest()


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
        if not world.distributed:
            raise InputError(f"cannot check the environment: {exc}") from None
        return Gate(False, [f"cannot check the environment: {exc}"], "failed")


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
                gate.how, gate.snapshot_json)
