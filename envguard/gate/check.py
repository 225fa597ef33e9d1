"""The gate: does this environment match a lock entry, and if not, why not?

``check(snapshot, lock)`` compares the snapshot with every entry. For each entry it
builds two snapshots restricted to what the lock pins (the entry as a reference, and
the current environment cut to the same scope), so the ordinary diff engine and
its rules explain a mismatch: ``torch-build-changed``, ``foreign-stack-installed``,
``file-changed`` with both md5 values, and so on. The gate passes if any entry has
no material difference; otherwise the closest entry's findings are the reason.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import TYPE_CHECKING

from envguard.changes import SnapshotDiff, diff
from envguard.errors import InputError
from envguard.findings import Finding, Severity
from envguard.frozen import frozen
from envguard.gate.lockfile import Lock, LockEntry, pinned_names
from envguard.model import (
    Distribution,
    Files,
    Integrity,
    IntegrityIssue,
    Snapshot,
    TorchIdentity,
    TrackedFile,
)

if TYPE_CHECKING:
    from envguard.explain.report import DiffReport
    from envguard.gate.machine import NewMachine


@frozen
class EntryComparison:
    entry: LockEntry
    diff: SnapshotDiff
    findings: tuple[Finding, ...]
    """Why the entry does not match: explained only for :attr:`GateResult.closest` when no
    entry matches (the only findings anyone reads); empty for the others."""

    @property
    def matches(self) -> bool:
        return self.diff.equivalent


@frozen
class NextStep:
    """What to do about a refusal: why, then the one command, as a person pastes it."""

    why: str
    command: str


@frozen
class GateResult:
    lock: Lock
    lock_path: str
    snapshot: Snapshot
    comparisons: tuple[EntryComparison, ...]
    cache_note: Finding | None = None
    """A cold compile cache under ``warn-if-cold`` (a warning) or ``require-warm`` (fatal)."""
    new_machine: NewMachine | None = None
    """Set when nothing matches and no entry was recorded on this machine or one like it."""
    relock: tuple[str, ...] = ()
    """On a refusal: the arguments of ``envguard lock`` that lock this environment into the
    lock checked (``NAME``, with ``--lock`` and ``--python`` where the defaults differ);
    ``envguard check`` takes the same ones."""
    project_root: str = ""
    """The folder the lock's file paths are relative to."""
    next_step: NextStep | None = None
    """On a refusal: remove what the lock forbids, re-lock, or bless a new machine."""

    @property
    def matched(self) -> EntryComparison | None:
        return next((c for c in self.comparisons if c.matches), None)

    @property
    def closest(self) -> EntryComparison | None:
        if not self.comparisons:
            return None
        return min(self.comparisons, key=_closeness)

    @property
    def passed(self) -> bool:
        cache_blocks = (self.cache_note is not None
                        and self.cache_note.severity is Severity.CRITICAL)
        return self.matched is not None and not cache_blocks

    @property
    def findings(self) -> tuple[Finding, ...]:
        """Why the gate failed (or what it warns about): the closest entry's findings; on a
        new machine, that it is new (and forbidden packages, wrong on any machine)."""
        base = () if self.matched is not None else (
            self.closest.findings if self.closest else ())
        if self.new_machine is not None:
            from envguard.gate.machine import new_machine_finding

            base = (new_machine_finding(self.new_machine, self.lock_path),
                    *(f for f in base if f.rule in _WRONG_ANYWHERE))
        note = self.cache_note
        if note is None:
            return base
        if note.severity is not Severity.CRITICAL:
            return (*base, note)  # a warning only: never the headline of a refusal
        return tuple(sorted((note, *base), key=lambda f: (f.severity.rank, -f.weight, f.rule)))

    def diff_report(self) -> DiffReport:
        """The matched (or else the closest) entry against this environment. On a new
        machine it lists no changes (another machine's package set is not a change), only
        the ``new-machine`` finding; a blocking cold cache is its refusal."""
        from envguard.explain.report import DiffReport

        closest = self.matched or self.closest
        if closest is None:
            raise InputError(f"{self.lock_path}: the lock has no environment entries")
        old_name = f"{self.lock_path} [{closest.entry.id}]"
        if self.new_machine is not None:
            return DiffReport(old_name=old_name, new_name="this environment",
                              diff=SnapshotDiff(changes=()), findings=self.findings,
                              refused_by=next(f.title for f in self.findings
                                              if f.rule == "new-machine"))
        blocking = self.cache_note if (self.cache_note is not None and not self.passed
                                       and self.matched is not None) else None
        return DiffReport(old_name=old_name, new_name="this environment", diff=closest.diff,
                          findings=self.findings,
                          refused_by=blocking.title if blocking is not None else None)


def next_step(result: GateResult, relock: tuple[str, ...]) -> NextStep | None:
    """The command a refusal ends with (None when the gate passed). ``relock``: the
    arguments of ``envguard lock`` that write this environment into this lock."""
    if result.passed:
        return None
    from envguard.explain.remedies import remedy, shell_line, uv_pip_uninstall

    forbidden = result.lock.forbidden_installed(result.snapshot)
    if forbidden:  # a re-lock would be refused too
        python = relock[relock.index("--python") + 1] if "--python" in relock else None
        return NextStep(why="remove what the lock forbids first (a lock refuses it too):",
                        command=remedy(lambda: uv_pip_uninstall(forbidden, python=python)))
    if result.matched is not None:  # only the compile cache blocks
        return NextStep(why="the environment matches, but the lock requires a warm compile "
                        "cache: warm it with one single-threaded step, or restore a saved one:",
                        command="envguard cache restore")
    why = ("this machine is new to the lock; if this environment is known-good, bless it:"
           if result.new_machine is not None else
           "if the change is intended, re-lock this environment (else undo it: the remedies "
           "are in --verbose):")
    return NextStep(why=why, command=shell_line(["envguard", "lock", *relock]))


def _closeness(comparison: EntryComparison) -> tuple[int, str]:
    return len(comparison.diff.material), comparison.entry.id


_WRONG_ANYWHERE = frozenset({"forbidden-package-installed", "foreign-stack-installed"})


def _minor(version: str) -> str:
    return ".".join(version.split(".")[:2])


def _current_closure(lock: Lock, snapshot: Snapshot, project_root: Path) -> set[str]:
    """What the lock pins as installed now (the closure, or every distribution), plus
    forbidden packages; the same for every entry, so computed once per check."""
    names = pinned_names(snapshot, lock, project_root)
    names |= set(lock.forbidden_installed(snapshot))
    return names - {p.name for p in snapshot.packages if p.editable}


def _cut(snapshot: Snapshot, names: set[str], files: dict[str, TrackedFile],
         torch: TorchIdentity) -> Snapshot:
    """The snapshot reduced to the gate's scope; everything outside it made identical."""
    interp = dataclasses.replace(snapshot.interpreter,
                                 version=_minor(snapshot.interpreter.version),
                                 executable="", prefix="", base_prefix="", is_venv=True,
                                 best_tag=None, sys_path=[])
    integrity = dataclasses.replace(snapshot.integrity, issues=[
        i for i in snapshot.integrity.issues if i.package in names])
    # Sizes are not pinned (md5 and sha256 are); patterns differ between the two sides.
    pinned = [dataclasses.replace(f, size=None, pattern=f.path) for f in files.values()]
    return dataclasses.replace(
        snapshot, interpreter=interp, torch=torch,
        packages=[p for p in snapshot.packages if p.name in names],
        integrity=integrity, files=Files(files=pinned),
        deep=None)


def _reference(lock: Lock, entry: LockEntry, current: Snapshot, project_root: Path) -> tuple[
        list[Distribution], dict[str, TrackedFile], TorchIdentity]:
    by_name = {p.name: p for p in current.packages}
    dists = []
    for locked in entry.packages:
        base = by_name.get(locked.name)
        if base is None:
            base = Distribution(name=locked.name, version=None, location="",
                                metadata_dir=f"{locked.name}.dist-info")
        dists.append(dataclasses.replace(base, version=locked.version,
                                         fingerprint=locked.fingerprint or base.fingerprint,
                                         shadowed=[], editable=False))
    files = {}
    for f in lock.files:
        path = str((project_root / f.path).resolve()) if not os.path.isabs(f.path) else f.path
        files[path] = TrackedFile(pattern=path, path=path, exists=True, md5=f.md5,
                                  sha256=f.sha256)
    return dists, files, dataclasses.replace(
        current.torch, present=entry.torch_version is not None, version=entry.torch_version,
        git_version=entry.torch_git_version, cuda=entry.torch_cuda,
        triton_version=entry.triton_version)


@frozen
class _Sides:
    """One entry's comparison before it is explained: what the entry pins, what is here now
    (both cut to the packages and files the entry concerns), and their diff."""

    reference: Snapshot
    now: Snapshot
    changes: SnapshotDiff


def _sides(entry: LockEntry, lock: Lock, current: Snapshot, project_root: Path,
           current_closure: set[str] | None,
           accepted: tuple[IntegrityIssue, ...]) -> _Sides:
    ref_dists, ref_files, ref_torch = _reference(lock, entry, current, project_root)
    if current_closure is None:
        current_closure = _current_closure(lock, current, project_root)
    editable = {p.name for p in current.packages if p.editable}
    names = ({p.name for p in entry.packages} - editable) | current_closure
    cur_files = {f.path: f for f in current.files.files if f.path in ref_files}
    for path in ref_files:
        cur_files.setdefault(path, TrackedFile(pattern=path, path=path, exists=False))
    now = _cut(current, names, cur_files, current.torch)
    ref_interp = dataclasses.replace(current.interpreter,
                                     implementation=entry.python_implementation,
                                     version=entry.python_version)
    reference = _cut(dataclasses.replace(current, interpreter=ref_interp,
                                         packages=ref_dists, integrity=Integrity(
                                             mode=current.integrity.mode,
                                             issues=list(accepted))),
                     {p.name for p in ref_dists}, ref_files, ref_torch)
    # Compile-compat keys and wheel families are not pinned by a lock entry.
    reference = dataclasses.replace(reference, torch=dataclasses.replace(
        reference.torch, compat_key=now.torch.compat_key, dist_version=now.torch.dist_version,
        triton_fingerprint=now.torch.triton_fingerprint,
        cuda_wheel_family=now.torch.cuda_wheel_family, cuda_wheels=now.torch.cuda_wheels,
        location=now.torch.location))
    return _Sides(reference=reference, now=now, changes=diff(reference, now))


def _explained(entry: LockEntry, lock: Lock, current: Snapshot, sides: _Sides) -> EntryComparison:
    """The comparison with its findings (the rules run only for a mismatch: the gate's happy
    path does not even import them)."""
    if sides.changes.equivalent:  # a match's findings are never shown
        return EntryComparison(entry=entry, diff=sides.changes, findings=())
    from envguard.explain import explain
    from envguard.explain.remedies import remedy, uv_pip_uninstall
    from envguard.explain.tables import is_serving_stack

    findings = explain(sides.reference, sides.now, sides.changes)
    custom = [n for n in lock.forbidden_installed(current) if not is_serving_stack(n)]
    if custom:
        findings.insert(0, Finding(
            rule="forbidden-package-installed", severity=Severity.CRITICAL,
            title=f"packages this lock forbids are installed: {', '.join(custom)}",
            explanation="The lock's `forbidden` patterns name packages that must not be in "
                        "this environment.",
            evidence=tuple(f"{n} matches one of: {', '.join(lock.forbidden)}" for n in custom),
            remedy=(remedy(lambda: uv_pip_uninstall(custom)),), weight=85))
    return EntryComparison(entry=entry, diff=sides.changes, findings=tuple(findings))


def compare(entry: LockEntry, lock: Lock, current: Snapshot, project_root: Path,
            current_closure: set[str] | None = None,
            accepted: tuple[IntegrityIssue, ...] = ()) -> EntryComparison:
    """One entry against ``current``, explained when it does not match. ``accepted``: files
    that already differed from RECORD when the entry was locked (an image that appends its
    CA to certifi's bundle); only new differences count. (:func:`check` compares every
    entry and explains only the closest.)"""
    return _explained(entry, lock, current,
                      _sides(entry, lock, current, project_root, current_closure, accepted))


def _cache_note(lock: Lock, snapshot: Snapshot) -> Finding | None:
    if lock.cache_policy == "ignore":
        return None
    inductor = next((c for c in snapshot.caches if c.kind == "inductor"), None)
    if inductor is not None and inductor.exists and inductor.files:
        return None
    fatal = lock.cache_policy == "require-warm"
    where = inductor.path if inductor else "the inductor cache"
    return Finding(
        rule="compile-cache-cold",
        severity=Severity.CRITICAL if fatal else Severity.WARNING,
        title=f"the torch.compile cache {where} is empty"
              + (" and this lock requires a warm cache" if fatal else ""),
        explanation="The first step will compile everything cold; first-time compiles in "
                    "several threads of one process can hang or fail (see docs/DIFF.md, "
                    "compile-cache-cold).",
        evidence=(f"{where}: {'missing' if not inductor or not inductor.exists else 'empty'}",),
        remedy=("warm the cache with one single-threaded step first, or restore it",),
        weight=98)


def _accepted_issues(entry: LockEntry, lock_dir: Path) -> tuple[IntegrityIssue, ...]:
    """Integrity differences already present in the entry's reference snapshot."""
    from envguard.snapshot_file import read_integrity_issues

    if not entry.snapshot_file:
        return ()
    try:
        return tuple(read_integrity_issues(lock_dir / entry.snapshot_file))
    except InputError:
        return ()


def _strict_entry(entry: LockEntry, lock_dir: Path) -> LockEntry:
    """The entry with every distribution of its full reference snapshot pinned (--strict)."""
    from envguard.gate.lockfile import LockedPackage
    from envguard.snapshot_file import read_snapshot

    if not entry.snapshot_file:
        raise InputError(f"--strict needs the full snapshot of entry {entry.id}, and the lock "
                         "does not name one")
    full = read_snapshot(lock_dir / entry.snapshot_file, follow=False)
    pinned = tuple(LockedPackage(name=p.name, version=p.version or "", fingerprint=p.fingerprint)
                   for p in full.packages if not p.editable)
    return dataclasses.replace(entry, packages=pinned)


def check(snapshot: Snapshot, lock: Lock, lock_path: str, project_root: Path, *,
          strict: bool = False) -> GateResult:
    """Compare with every entry. ``strict``: every distribution must match the entry's full
    snapshot, not only the command's closure."""
    now = _current_closure(lock, snapshot, project_root)
    entries = lock.entries
    if strict:
        lock_dir = Path(lock_path).parent
        entries = tuple(_strict_entry(e, lock_dir) for e in entries)
        now |= {p.name for p in snapshot.packages if not p.editable}
    lock_dir = Path(lock_path).parent
    touched = any(i.package in now for i in snapshot.integrity.issues)

    accepted = [_accepted_issues(e, lock_dir) if touched else () for e in entries]
    sides = [_sides(e, lock, snapshot, project_root, now, a)
             for e, a in zip(entries, accepted, strict=True)]
    comparisons = tuple(EntryComparison(entry=e, diff=s.changes, findings=())
                        for e, s in zip(entries, sides, strict=True))
    if comparisons and not any(c.matches for c in comparisons):
        # Explain the closest entry only: its findings are the only ones anyone reads; its
        # diff is the one already computed.
        i = min(range(len(comparisons)), key=lambda k: _closeness(comparisons[k]))
        explained = _explained(entries[i], lock, snapshot, sides[i])
        comparisons = (*comparisons[:i], explained, *comparisons[i + 1:])
    result = GateResult(lock=lock, lock_path=lock_path, snapshot=snapshot,
                        comparisons=comparisons, cache_note=_cache_note(lock, snapshot),
                        project_root=str(project_root))
    if result.matched is None and result.closest is not None:
        from envguard.gate.machine import new_machine

        new = new_machine(lock, lock_dir, snapshot, result.closest.entry)
        result = dataclasses.replace(result, new_machine=new)
    return dataclasses.replace(result, next_step=next_step(result, (lock.name,)))
