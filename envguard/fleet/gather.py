"""Who this rank is, the shared-folder transport, and reading fleet inputs.

The launcher (torchrun, or anything that sets RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT)
tells each process who it is. Two transports, neither imports torch:

* :func:`envguard.fleet.listen.gather_net` (the default): envguard's own authenticated
  TCP transport (:mod:`envguard.fleet.wire`), rank 0 listening where MASTER_ADDR says.
* :func:`gather_dir`: each rank writes ``DIR/rank-<RANK>.json`` atomically; rank 0 waits
  until all WORLD_SIZE files exist. Only a folder every rank can reach.

Either way rank 0 reads each rank's snapshot with :func:`parse_snapshot`, the validating
reader of snapshot files, and a rank it cannot read is an error that names the rank.

Also reads the fleet inputs of ``envguard fleet diff``: snapshot files and fleet documents.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Mapping
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
    remasked,
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


def env_int(env: Mapping[str, str], name: str, default: int | None = None) -> int:
    """A launcher variable: ASCII digits, at most 9 of them; InputError (exit 2) if not."""
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
    rank, world = env_int(env, "RANK"), env_int(env, "WORLD_SIZE")
    if world > MAX_WORLD_SIZE:
        raise InputError(f"WORLD_SIZE={world} is more than {MAX_WORLD_SIZE} ranks")
    if world < 1 or rank >= world:
        raise InputError(f"RANK={rank} is not below WORLD_SIZE={world}")
    port = env.get("MASTER_PORT")
    if port and env_int(env, "MASTER_PORT") > 65535:
        raise InputError(f"MASTER_PORT={port} is not a TCP port")
    return Launch(rank=rank, world_size=world, local_rank=env_int(env, "LOCAL_RANK", 0),
                  master_addr=env.get("MASTER_ADDR") or None,
                  master_port=env_int(env, "MASTER_PORT") if port else None)


def entry(snapshot: Snapshot, launch: Launch) -> dict[str, Any]:
    """One member of the fleet document (``envguard.fleet/1``)."""
    return {"rank": launch.rank, "world_size": launch.world_size,
            "host": snapshot.system.hostname, "snapshot": snapshot.to_dict()}


# -- a shared folder ------------------------------------------------------------------

def rank_file(folder: Path, rank: int) -> Path:
    return folder / f"rank-{rank}.json"


def gather_dir(snapshot: Snapshot, launch: Launch, folder: Path, timeout_s: float,
               *, clock: Callable[[], float] = time.time) -> list[dict[str, Any]] | None:
    """Write this rank's snapshot to ``folder``; on rank 0, wait for all and read them."""
    started = clock()
    # A shared folder: a link or FIFO another user planted is refused, never written through.
    write_text_atomic(rank_file(folder, launch.rank), snapshot.to_json(), state_root=folder)
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
            try:
                found[r] = read_snapshot_file(path)
            except InputError as exc:  # exit 2, as for every input file; never skipped
                raise InputError(f"rank {r} wrote a snapshot rank 0 cannot read: {exc}") from None
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


def parse_snapshot(data: bytes | memoryview, name: str) -> Snapshot:
    """A snapshot from the bytes of its JSON text (a rank's, received by rank 0), validated
    as a snapshot file is; InputError naming ``name`` when it is not one."""
    try:
        text = str(data, "utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{name}: not UTF-8 (byte {exc.start})") from None
    with naming(name):
        return Snapshot.from_json(text)


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
            return remasked(members_from_document(p.name, data))
        snapshot = Snapshot.from_dict(data)
    match = RANK_FILE.fullmatch(p.name)
    return remasked([member_from_snapshot(p.name, snapshot,
                                          rank=int(match.group(1)) if match else None)])
