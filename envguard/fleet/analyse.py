"""Which rank differs? Group a fleet's snapshots into identical environments, name outliers.

Pure: no I/O, no printing. Two snapshots are "identical" when the diff engine finds no
material change between them (what ``envguard diff`` calls equivalent), after removing
what differs between ranks by design:

* launcher bookkeeping variables (``TORCHELASTIC_ERROR_FILE`` is a per-rank temp path,
  ``RANK``/``LOCAL_RANK`` when a project records them, ...), see ``PER_RANK_VARIABLES``;
* the folder each rank ran in: a tracked file found through a relative ``--file``
  pattern is compared by its path relative to that folder, so ``config.yaml`` in two
  node-local checkouts is one file whose hashes must agree.

Host names, timestamps, cache sizes and install paths are already immaterial to the
diff engine. Snapshots are grouped greedily against each group's first member; the
largest group is the baseline (ties: the group of the first input), unless the caller
names one. Every other group is an outlier, explained by the diff engine's rules.
"""

from __future__ import annotations

import dataclasses
import glob
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from envguard.changes import SnapshotDiff, diff
from envguard.errors import InputError, SnapshotValidationError
from envguard.explain import Finding, explain
from envguard.frozen import frozen
from envguard.model import Files, Snapshot, TrackedFile
from envguard.validation import type_name

FLEET_SCHEMA = "envguard.fleet/1"
FLEET_DIFF_SCHEMA = "envguard.fleet-diff/1"

PER_RANK_VARIABLES = frozenset({
    # set by torchrun / torch.distributed.elastic, different per rank or per launch
    "TORCHELASTIC_ERROR_FILE", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_TIMER_FILE", "TORCHELASTIC_HEALTH_CHECK_PORT",
    # rank identity, when a project records it through [tool.envguard] env
    "RANK", "LOCAL_RANK", "GROUP_RANK", "ROLE_RANK", "NODE_RANK", "MASTER_PORT",
    "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID", "SLURM_JOB_ID", "SLURM_STEP_ID",
    "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "PMI_RANK", "PMIX_RANK",
    # where fleet snapshot's own transport listens: per launch, like MASTER_PORT
    "ENVGUARD_FLEET_PORT", "ENVGUARD_FLEET_ADDR",
})
RANK_VARIABLES = ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK")


@frozen
class Member:
    """One rank's snapshot, named by where it came from."""

    name: str
    """The file it was read from (``rank3.json``, or ``fleet.json#3`` for rank 3 of one)."""
    snapshot: Snapshot
    rank: int | None = None
    world_size: int | None = None
    host: str | None = None

    @property
    def label(self) -> str:
        """``rank 5 (host gpu-node-2, rank5.json)``, or just the file name."""
        extra = [f"host {self.host}"] if self.host else []
        if self.rank is None:
            return self.name + (f" ({extra[0]})" if extra else "")
        return f"rank {self.rank} ({', '.join([*extra, self.name])})"


@frozen
class Group:
    members: tuple[Member, ...]
    diff: SnapshotDiff
    """Versus the baseline (empty for the baseline group)."""
    findings: tuple[Finding, ...] = ()


@frozen
class FleetReport:
    baseline: Group
    """The group identical to the baseline: the majority, unless one was named."""
    baseline_name: str
    """The member (or file) every other group is compared with."""
    baseline_reason: str
    """``majority``, ``tie: the group of the first input``, or ``named by --baseline``."""
    outliers: tuple[Group, ...]
    ignored_variables: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def total(self) -> int:
        return len(self.baseline.members) + sum(len(g.members) for g in self.outliers)

    @property
    def equivalent(self) -> bool:
        return not self.outliers

    @property
    def verdict(self) -> str:
        if self.equivalent:
            return f"all {self.total} snapshot(s) equivalent"
        n = sum(len(g.members) for g in self.outliers)
        return (f"{n} of {self.total} snapshot(s) differ from the baseline, in "
                f"{len(self.outliers)} group(s)")


def member_from_snapshot(name: str, snapshot: Snapshot, *, rank: int | None = None,
                         world_size: int | None = None, host: str | None = None) -> Member:
    """A member; rank from a recorded RANK-like variable and host from the snapshot when
    not given."""
    if rank is None:
        for var in RANK_VARIABLES:
            value = snapshot.environment.variables.get(var)
            if value is not None and value.value is not None and value.value.isdigit():
                rank = int(value.value)
                break
    return Member(name=name, snapshot=snapshot, rank=rank, world_size=world_size,
                  host=host or snapshot.system.hostname or None)


def remasked(members: list[Member]) -> list[Member]:
    """Members read from files (``fleet diff``'s inputs, perhaps written by an older
    envguard or by hand) as envguard would write them today: each snapshot re-masked
    (:func:`envguard.snapshot_file.remask`), names and hosts redacted."""
    from envguard.redact import redact_text
    from envguard.snapshot_file import remask

    return [dataclasses.replace(m, name=redact_text(m.name), snapshot=remask(m.snapshot),
                                host=redact_text(m.host) if m.host else m.host)
            for m in members]


def _relative_key(f: TrackedFile, raw_patterns: Sequence[str]) -> str:
    """A tracked file's path relative to the folder its relative ``--file`` pattern was
    resolved in; other files keep their absolute path."""
    for raw in raw_patterns:
        if not raw or os.path.isabs(raw):
            continue
        suffix = os.sep + os.path.normpath(raw)
        pattern = os.path.normpath(f.pattern)
        if not pattern.endswith(suffix):
            continue
        root = pattern[: -len(suffix)]
        if f.path == pattern:
            return os.path.normpath(raw)
        if glob.has_magic(raw) and f.path.startswith(root + os.sep):
            return f.path[len(root) + 1:]
    return f.path


def normalise(snapshot: Snapshot, ignored: Iterable[str] = PER_RANK_VARIABLES) -> Snapshot:
    """The snapshot without what differs between ranks by design (see the module doc)."""
    drop = frozenset(ignored)
    variables = {k: v for k, v in snapshot.environment.variables.items() if k not in drop}
    raw = snapshot.options.file_patterns
    tracked = [dataclasses.replace(f, path=_relative_key(f, raw)) for f in snapshot.files.files]
    return dataclasses.replace(
        snapshot,
        environment=dataclasses.replace(snapshot.environment, variables=variables),
        files=Files(files=sorted(tracked, key=lambda f: f.path), git=snapshot.files.git),
    )


def _group(members: Sequence[Member], normalised: Mapping[int, Snapshot]) -> list[list[int]]:
    groups: list[list[int]] = []
    for i in range(len(members)):
        for g in groups:
            if diff(normalised[g[0]], normalised[i]).equivalent:
                g.append(i)
                break
        else:
            groups.append([i])
    return groups


def analyse(members: Sequence[Member], *, baseline: Member | None = None,
            ignored_variables: Iterable[str] = (), notes: Iterable[str] = ()) -> FleetReport:
    """Group ``members`` and explain every group that differs from the baseline.

    ``baseline``: a member of ``members`` (its group is the baseline), or an outside
    reference snapshot (the group equivalent to it, if any, is the baseline group).
    """
    if not members:
        raise InputError("no snapshots to compare")
    ignored = PER_RANK_VARIABLES | frozenset(ignored_variables)
    norm = {i: normalise(m.snapshot, ignored) for i, m in enumerate(members)}
    groups = _group(members, norm)
    if baseline is not None:
        ref = normalise(baseline.snapshot, ignored)
        index = next((i for i, m in enumerate(members) if m is baseline), None)
        if index is not None:
            base_idx = next(n for n, g in enumerate(groups) if index in g)
        else:
            base_idx = next((n for n, g in enumerate(groups)
                             if diff(ref, norm[g[0]]).equivalent), -1)
        reason, base_name = "named by --baseline", baseline.label
    else:
        sizes = [len(g) for g in groups]
        base_idx = max(range(len(groups)), key=lambda n: (sizes[n], -n))
        tie = sizes.count(sizes[base_idx]) > 1
        reason = "tie: the group of the first input" if tie else "majority"
        ref = norm[groups[base_idx][0]]
        base_name = members[groups[base_idx][0]].label
    outliers = []
    for n, g in enumerate(groups):
        if n == base_idx:
            continue
        changes = diff(ref, norm[g[0]])
        outliers.append(Group(members=tuple(members[i] for i in g), diff=changes,
                              findings=tuple(explain(ref, norm[g[0]], changes))))
    base_members = tuple(members[i] for i in groups[base_idx]) if base_idx >= 0 else ()
    return FleetReport(
        baseline=Group(members=base_members, diff=SnapshotDiff(())),
        baseline_name=base_name, baseline_reason=reason, outliers=tuple(outliers),
        ignored_variables=tuple(sorted(ignored)), notes=tuple(notes))


# -- the fleet document ---------------------------------------------------------------

def fleet_document(members: Sequence[Member], world_size: int) -> dict[str, Any]:
    """``envguard.fleet/1``: every rank's snapshot, with rank, world size and host."""
    return {"schema": FLEET_SCHEMA, "world_size": world_size,
            "snapshots": [{"rank": m.rank, "world_size": m.world_size, "host": m.host,
                           "snapshot": m.snapshot.to_dict()} for m in members]}


def is_fleet_document(data: object) -> bool:
    return isinstance(data, dict) and isinstance(data.get("schema"), str) \
        and str(data["schema"]).startswith("envguard.fleet/")


def members_from_document(name: str, data: Mapping[str, Any]) -> list[Member]:
    """The members of a fleet document; SnapshotValidationError names the bad entry."""
    if data.get("schema") != FLEET_SCHEMA:
        raise SnapshotValidationError(f"unsupported fleet schema {data.get('schema')!r} "
                                      f"(this envguard reads {FLEET_SCHEMA})", context="schema")
    entries = data.get("snapshots")
    if not isinstance(entries, list):
        raise SnapshotValidationError(f"expected a list, got {type_name(entries)}",
                                      context="snapshots")
    world = data.get("world_size")
    out = []
    for n, entry in enumerate(entries):
        where = f"snapshots[{n}]"
        if not isinstance(entry, dict):
            raise SnapshotValidationError(f"expected an object, got {type_name(entry)}",
                                          context=where)
        rank, host = entry.get("rank"), entry.get("host")
        if rank is not None and (not isinstance(rank, int) or isinstance(rank, bool)):
            raise SnapshotValidationError(f"expected int, got {type_name(rank)}",
                                          context=f"{where}.rank")
        if host is not None and not isinstance(host, str):
            raise SnapshotValidationError(f"expected str, got {type_name(host)}",
                                          context=f"{where}.host")
        try:
            snapshot = Snapshot.from_dict(entry.get("snapshot"))
        except SnapshotValidationError as exc:
            raise exc.within(f"{where}.snapshot") from None
        label = f"{name}#{rank if rank is not None else n}"
        out.append(member_from_snapshot(label, snapshot, rank=rank, host=host,
                                        world_size=world if isinstance(world, int) else None))
    if not out:
        raise SnapshotValidationError("a fleet document with no snapshots", context="snapshots")
    return out
