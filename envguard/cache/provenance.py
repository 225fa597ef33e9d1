"""Build provenance of a compile cache: the marker envguard writes where it fills one.

A snapshot only reads the marker (:mod:`envguard.probe.caches`). It is written here, and
only where envguard itself filled or restored the cache, so that ``valid`` in
``envguard cache status`` means "filled under this build" and not merely "seen":

* ``envguard cache save`` (the archive is labelled with this build; a cache whose
  marker names only other builds is left as it is) and ``envguard cache restore`` (the
  archive's build);
* ``envguard cache mark`` (the user says this build filled it);
* dflash-train's warm-up, through :func:`mark`.

Nothing here prints; a marker that cannot be written is an :class:`OutputError`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import stat
from datetime import datetime, timezone
from pathlib import Path

from envguard.atomic import write_text_atomic
from envguard.errors import InputError, OutputError
from envguard.frozen import frozen
from envguard.model import BuildStamp, Snapshot, TorchIdentity
from envguard.probe.caches import MARKER_NAME, read_marker

MARKED_KINDS = ("inductor", "triton")


@frozen
class Marked:
    kind: str
    path: str
    result: str
    """``created``, ``added`` (another build was recorded before) or ``present``."""


def stamp_of(torch: TorchIdentity) -> BuildStamp:
    if torch.compat_key is None:
        raise InputError("no torch build to record: torch is not installed in that "
                         "environment (no compile-compat key)")
    return BuildStamp(compat_key=torch.compat_key, torch_version=torch.version,
                      torch_git_version=torch.git_version, triton_version=torch.triton_version,
                      first_seen=datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"))


def mark_folder(root: str | os.PathLike[str], stamp: BuildStamp) -> str:
    """Record ``stamp`` in the marker of the cache folder ``root``; ``present`` when it
    is already there. OutputError when the folder or the marker cannot be written."""
    folder = os.fspath(root)
    if not os.path.isdir(folder):
        raise InputError(f"{folder}: not a compile-cache folder")
    marker = os.path.join(folder, MARKER_NAME)
    try:
        if not stat.S_ISREG(os.lstat(marker).st_mode):
            raise OutputError(f"{marker}: not a regular file; the marker is not written")
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise OutputError(f"{marker}: {exc.strerror or exc}") from None
    previous = read_marker(folder) or []
    if any(s.compat_key == stamp.compat_key for s in previous):
        return "present"
    doc = {"builds": [dataclasses.asdict(s) for s in [*previous, stamp]]}
    write_text_atomic(marker, json.dumps(doc, indent=1) + "\n")
    return "added" if previous else "created"


def mark_snapshot(snapshot: Snapshot, *, kinds: tuple[str, ...] = MARKED_KINDS,
                  skip_stale: bool = False) -> list[Marked]:
    """Mark every existing, non-empty inductor/triton cache of ``snapshot`` with its build.
    ``skip_stale``: leave a cache whose marker names only other builds as it is."""
    stamp = stamp_of(snapshot.torch)
    done: list[Marked] = []
    for c in snapshot.caches:
        if c.kind not in kinds or not c.exists or not c.files:
            continue
        if skip_stale and c.populated_under and c.marker != "seen":
            done.append(Marked(kind=c.kind, path=c.path, result="skipped"))
            continue
        done.append(Marked(kind=c.kind, path=c.path, result=mark_folder(c.path, stamp)))
    return done


def mark(path: str | os.PathLike[str] | None = None, snapshot: Snapshot | None = None, *,
         torch: TorchIdentity | None = None) -> list[Marked]:
    """Record that the current build filled a compile cache (for a trainer's warm-up).

    ``path``: the cache folder (default: every non-empty inductor/triton cache of
    ``snapshot``). The build comes from ``snapshot`` (or ``torch``); with neither, a
    locations-only snapshot of envguard's own interpreter is taken.
    """
    if torch is None:
        if snapshot is None:
            from envguard.probe import collect
            from envguard.probe.options import locations_only

            snapshot = collect(locations_only(None))
        torch = snapshot.torch
    if path is None:
        if snapshot is None:
            raise InputError("mark(): give the cache folder or a snapshot")
        return mark_snapshot(dataclasses.replace(snapshot, torch=torch))
    folder = Path(path)
    return [Marked(kind="folder", path=str(folder),
                   result=mark_folder(folder, stamp_of(torch)))]
