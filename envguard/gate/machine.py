"""A new machine is not a drifted one: was any entry of a lock recorded on a machine like this?

An entry records the interpreter (implementation and minor version) and torch's build
(its CUDA version, or the local label such as ``cpu``); its reference snapshot adds the
host name and the platform. An entry counts as recorded *here* when its host is this host,
or when it was recorded on the same kind of machine: the same interpreter, torch build and
platform (CI runners and cluster nodes get new host names but are the same kind). When no
entry is, the environment is new to the lock rather than drifted: the gate says so and
names the closest entry, instead of listing another machine's package set as changes.
"""

from __future__ import annotations

from pathlib import Path

from envguard.errors import InputError
from envguard.findings import Finding, Severity
from envguard.frozen import frozen
from envguard.gate.lockfile import Lock, LockEntry
from envguard.model import Snapshot


@frozen
class Machine:
    python: str
    """``cpython 3.11``"""
    torch: str
    """``torch CUDA 13.0``, ``torch cpu`` or ``no torch``"""
    host: str | None = None
    platform: str | None = None
    """``linux-x86_64``; None when the entry has no reference snapshot."""

    def same_kind(self, other: Machine) -> bool:
        return (self.python, self.torch) == (other.python, other.torch) and (
            self.platform is None or other.platform is None or self.platform == other.platform)

    def kind(self) -> str:
        """``linux-x86_64, cpython 3.11, torch cpu``"""
        return ", ".join(p for p in (self.platform, self.python, self.torch) if p)

    def describe(self) -> str:
        return f"{self.host} ({self.kind()})" if self.host else self.kind()


@frozen
class NewMachine:
    """No entry of the lock was recorded here; ``closest`` is the nearest entry."""

    lock_name: str
    here: Machine
    closest_id: str
    closest: Machine
    snapshot_file: str | None
    """The closest entry's reference snapshot, relative to the lockfile's folder."""
    entries: tuple[tuple[str, Machine], ...]
    """Where every entry was recorded, by entry id."""


def _minor(version: str) -> str:
    return ".".join(version.split(".")[:2])


def _torch(version: str | None, cuda: str | None) -> str:
    if version is None:
        return "no torch"
    if cuda:
        return f"torch CUDA {cuda}"
    label = version.partition("+")[2]
    return f"torch {label or 'cpu'}"


def of_snapshot(snapshot: Snapshot) -> Machine:
    interp, torch = snapshot.interpreter, snapshot.torch
    return Machine(python=f"{interp.implementation} {_minor(interp.version)}",
                   torch=_torch(torch.version if torch.present else None, torch.cuda),
                   host=snapshot.system.hostname or None, platform=interp.platform or None)


def of_entry(entry: LockEntry, lock_dir: Path) -> Machine:
    host = platform = None
    if entry.snapshot_file:
        from envguard.snapshot_file import read_snapshot

        try:
            reference = read_snapshot(lock_dir / entry.snapshot_file, follow=False)
        except InputError:
            pass
        else:
            host = reference.system.hostname or None
            platform = reference.interpreter.platform or None
    return Machine(python=f"{entry.python_implementation} {_minor(entry.python_version)}",
                   torch=_torch(entry.torch_version, entry.torch_cuda), host=host,
                   platform=platform)


def new_machine(lock: Lock, lock_dir: Path, snapshot: Snapshot,
                closest: LockEntry) -> NewMachine | None:
    """None when some entry was recorded on this host or on a machine of its kind."""
    here = of_snapshot(snapshot)
    machines = {e.id: of_entry(e, lock_dir) for e in lock.entries}
    if any((here.host is not None and m.host == here.host) or m.same_kind(here)
           for m in machines.values()):
        return None
    return NewMachine(lock_name=lock.name, here=here, closest_id=closest.id,
                      closest=machines[closest.id], snapshot_file=closest.snapshot_file,
                      entries=tuple(machines.items()))


def new_machine_finding(new: NewMachine, lock_path: str) -> Finding:
    """Why the gate refuses a new machine, and how to bless it."""
    closest = f"the closest entry, {new.closest_id}, was recorded on {new.closest.describe()}"
    from envguard.explain.remedies import envguard_command, shell_line

    remedy = ["if this environment is known-good, bless it: "
              + shell_line(envguard_command("lock", new.lock_name))]
    if new.snapshot_file:
        reference = Path(lock_path).parent / new.snapshot_file
        remedy.append(f"or rebuild {new.closest_id}'s package set here: "
                      + shell_line(envguard_command("restore", str(reference))))
    return Finding(
        rule="new-machine", severity=Severity.CRITICAL,
        title=f"no entry of this lock was recorded on {new.here.host or 'this machine'} or on "
              f"a machine like it ({new.here.kind()})",
        explanation=f"This is a new machine, not a drifted one: {closest}. Its packages "
                    "differ from another machine's by design, so they are not listed as "
                    "changes. Bless this environment once it is known to work, or rebuild a "
                    "locked one.",
        evidence=(f"this machine: {new.here.describe()}",
                  *(f"entry {i}: recorded on {m.describe()}" for i, m in new.entries)),
        remedy=tuple(remedy), weight=100)
