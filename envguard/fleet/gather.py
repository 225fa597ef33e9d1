"""Gather every rank's snapshot to rank 0: torch.distributed (gloo) or a shared folder.

The launcher (torchrun, or anything that sets RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT)
tells each process who it is. Two transports:

* ``gather_torch``: ``gather_object`` over the process group that is already
  initialised (through a gloo subgroup when its backend is not gloo), or over a gloo
  group made for the occasion from MASTER_ADDR/MASTER_PORT and destroyed afterwards.
  torch is imported here, lazily, and nowhere else in envguard's own process.
* ``gather_dir``: each rank writes ``DIR/rank-<RANK>.json`` atomically; rank 0 waits
  until all WORLD_SIZE files exist. No torch, only a folder every rank can reach.

Also reads the fleet inputs of ``envguard fleet diff``: snapshot files and fleet documents.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any

from envguard.atomic import write_text_atomic
from envguard.errors import (
    GatherError,
    InputError,
)
from envguard.fleet.analyse import (
    Member,
    is_fleet_document,
    member_from_snapshot,
    members_from_document,
)
from envguard.frozen import frozen
from envguard.model import Snapshot
from envguard.snapshot_file import MAX_SNAPSHOT_BYTES, naming, read_document

RANK_FILE = re.compile(r"rank-([0-9]{1,9})\.json")
POLL_S = 0.2
STALE_GRACE_S = 300.0
"""A rank file older than this before rank 0 started is from an earlier run: ignored."""
MAX_WORLD_SIZE = 65536
"""The largest WORLD_SIZE (and so RANK) believed: beyond it the variable is a mistake."""
MAX_FLEET_BYTES = MAX_SNAPSHOT_BYTES * 16
"""4 GiB: a fleet document holds every rank's snapshot (docs/CLI.md, "Input limits")."""


@frozen
class Launch:
    rank: int
    world_size: int
    local_rank: int
    master_addr: str | None = None
    master_port: int | None = None
    launched: bool = True
    """False: no RANK/WORLD_SIZE in the environment, a fleet of one."""


def _int(env: Mapping[str, str], name: str, default: int | None = None) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        if default is None:
            raise InputError(f"{name} is not set")
        return default
    if not (raw.strip().isascii() and raw.strip().isdigit()) or len(raw.strip()) > 9:
        raise InputError(f"{name}={raw[:40]!r} is not a non-negative integer of at most "
                         "9 digits")
    return int(raw)


def launch_from_env(env: Mapping[str, str]) -> Launch:
    """Who this process is; InputError for inconsistent launcher variables."""
    if "RANK" not in env and "WORLD_SIZE" not in env:
        return Launch(rank=0, world_size=1, local_rank=0, launched=False)
    rank, world = _int(env, "RANK"), _int(env, "WORLD_SIZE")
    if world > MAX_WORLD_SIZE:
        raise InputError(f"WORLD_SIZE={world} is more than {MAX_WORLD_SIZE} ranks")
    if world < 1 or rank >= world:
        raise InputError(f"RANK={rank} is not below WORLD_SIZE={world}")
    port = env.get("MASTER_PORT")
    if port and _int(env, "MASTER_PORT") > 65535:
        raise InputError(f"MASTER_PORT={port} is not a TCP port")
    return Launch(rank=rank, world_size=world, local_rank=_int(env, "LOCAL_RANK", 0),
                  master_addr=env.get("MASTER_ADDR") or None,
                  master_port=_int(env, "MASTER_PORT") if port else None)


def entry(snapshot: Snapshot, launch: Launch) -> dict[str, Any]:
    """One member of the fleet document (``envguard.fleet/1``)."""
    return {"rank": launch.rank, "world_size": launch.world_size,
            "host": snapshot.system.hostname, "snapshot": snapshot.to_dict()}


# -- torch.distributed ----------------------------------------------------------------

def gather_torch(item: dict[str, Any], launch: Launch,
                 timeout_s: float) -> list[dict[str, Any]] | None:
    """Every rank's ``item`` on rank 0 (in rank order); None on the other ranks."""
    try:
        import torch.distributed as dist
    except ImportError as exc:
        raise GatherError(f"torch.distributed is not importable ({exc}); "
                          "use --dir DIR (a folder every rank can write)") from None
    if not dist.is_available():
        raise GatherError("this torch build has no torch.distributed; use --dir DIR")
    made = False
    group = None
    try:
        if dist.is_initialized():
            if dist.get_backend() != "gloo":
                group = dist.new_group(backend="gloo",
                                       timeout=timedelta(seconds=timeout_s))
        else:
            if launch.master_addr is None or launch.master_port is None:
                raise GatherError("MASTER_ADDR/MASTER_PORT are not set and no process group "
                                  "is initialised; use --dir DIR")
            dist.init_process_group("gloo", rank=launch.rank, world_size=launch.world_size,
                                    timeout=timedelta(seconds=timeout_s))
            made = True
        out: list[Any] | None = [None] * launch.world_size if launch.rank == 0 else None
        dist.gather_object(item, out, dst=0, group=group)
    except GatherError:
        raise
    except (RuntimeError, ValueError, OSError) as exc:  # DistBackendError, timeouts, ...
        first = (str(exc).splitlines() or [""])[0]
        raise GatherError(f"gathering snapshots over torch.distributed failed: "
                          f"{type(exc).__name__}: {first}") from None
    finally:
        if made and dist.is_initialized():
            dist.destroy_process_group()
        elif group is not None:
            dist.destroy_process_group(group)
    return [x for x in out if isinstance(x, dict)] if out is not None else None


# -- a shared folder ------------------------------------------------------------------

def rank_file(folder: Path, rank: int) -> Path:
    return folder / f"rank-{rank}.json"


def gather_dir(snapshot: Snapshot, launch: Launch, folder: Path, timeout_s: float,
               *, clock: Callable[[], float] = time.time) -> list[dict[str, Any]] | None:
    """Write this rank's snapshot to ``folder``; on rank 0, wait for all and read them."""
    started = clock()
    write_text_atomic(rank_file(folder, launch.rank), snapshot.to_json())
    if launch.rank != 0:
        return None
    deadline = time.monotonic() + timeout_s
    found: dict[int, Snapshot] = {0: snapshot}
    while True:
        for r in range(launch.world_size):
            if time.monotonic() > deadline:
                break  # with thousands of ranks one pass takes long: the deadline holds here too
            if r in found:
                continue
            path = rank_file(folder, r)
            try:
                if path.stat().st_mtime < started - STALE_GRACE_S:
                    continue
            except OSError:
                continue
            found[r] = read_snapshot_file(path)
        if len(found) == launch.world_size:
            break
        if time.monotonic() > deadline:
            missing = [str(r) for r in range(launch.world_size) if r not in found]
            raise GatherError(f"timed out after {timeout_s:g} s waiting for rank(s) "
                              f"{', '.join(missing[:20])}{' …' if len(missing) > 20 else ''} "
                              f"to write {folder}/rank-<RANK>.json")
        time.sleep(POLL_S)
    return [entry(found[r], Launch(rank=r, world_size=launch.world_size, local_rank=0))
            for r in range(launch.world_size)]


# -- reading fleet inputs -------------------------------------------------------------

def _load_json(path: Path) -> Any:
    text = read_document(path, limit=MAX_FLEET_BYTES)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno} "
                         f"column {exc.colno})") from None
    except (ValueError, RecursionError):
        raise InputError(f"{path}: not a snapshot (malformed JSON)") from None


def read_snapshot_file(path: Path) -> Snapshot:
    data = _load_json(path)
    with naming(str(path)):
        return Snapshot.from_dict(data)


def read_members(path: str) -> list[Member]:
    """The members in one input: a snapshot file, or every rank of a fleet document.

    A snapshot file named ``rank-N.json`` (what ``--dir`` writes) is rank N.
    """
    p = Path(path)
    data = _load_json(p)
    with naming(path):
        if is_fleet_document(data):
            return members_from_document(p.name, data)
        snapshot = Snapshot.from_dict(data)
    match = RANK_FILE.fullmatch(p.name)
    return [member_from_snapshot(p.name, snapshot,
                                 rank=int(match.group(1)) if match else None)]
