"""Where a break lies when no package or variable change explains it: what bisect says
when GOOD's set fails too, or BAD's set passes once rebuilt.

A trial is a fresh venv holding exactly a set's packages, run with the set's variables in
the command's folder. So what a trial cannot hold is the answer: an installed file edited
after install, a package built here from source (a trial gets the index's wheel), and
what every trial shares with the user's shell (a module in the working folder or on
``PYTHONPATH`` that hides a real one) or with uv's cache (an edit made in place to a file uv
hard-linked from its cache is in the cache's copy, so every trial uv builds has it).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from envguard.doctor.facts import shadows
from envguard.doctor.shadowing import shadowed
from envguard.explain.queries import built_here, edit_in_uv_cache
from envguard.explain.remedies import remedy, uv_cache_clean
from envguard.explain.tables import CA_BUNDLES
from envguard.model import IntegrityIssue, Snapshot

__all__ = ["not_in_any_set", "shared_by_every_trial"]

_EDITED = ("size", "hash", "missing", "modified-after-install", "not-a-regular-file")


def shared_by_every_trial(snapshot: Snapshot, cwd: Path | None, env: Mapping[str, str]
                          ) -> tuple[str, ...]:
    """What makes every trial fail alike, GOOD's too: an edit in uv's cache (first), modules
    in the command's folder or on ``PYTHONPATH`` that hide real ones."""
    lines = [f"{s.folder} ({s.source}) holds '{m}', imported instead of {whose} {m}: every "
             "trial runs with it" for s, m, whose in shadowed(shadows(cwd, env), snapshot)]
    cached = _edited_in_uv_cache(snapshot)
    if cached:
        names = sorted({i.package for i in cached})
        first = cached[0]
        lines.insert(0, f"{len(cached)} installed file(s) are edited in uv's cache too "
                        f"({first.package}: {first.path}, hard-linked): every trial uv builds "
                        "from that cache has the edit, GOOD's set too; "
                        + remedy(lambda: uv_cache_clean(names[:4]), "drop them from it (",
                                 "), then bisect again"))
    return tuple(lines[:6])


def _edited_in_uv_cache(snapshot: Snapshot) -> list[IntegrityIssue]:
    return [i for i in snapshot.integrity.issues if i.problem in _EDITED and i.links
            and edit_in_uv_cache(snapshot, i.package)]


def not_in_any_set(bad: Snapshot, bad_name: str) -> tuple[str, ...]:
    """What BAD holds that a fresh venv of BAD's set does not: edited installed files and
    packages built here from source."""
    lines = []
    cached = _edited_in_uv_cache(bad)  # not "not in any set": in every one (above)
    edited = [i for i in bad.integrity.issues
              if i.problem in _EDITED and i.path not in CA_BUNDLES and i not in cached]
    if edited:
        packages = sorted({i.package for i in edited})
        lines.append(f"{len(edited)} installed file(s) in {bad_name} differ from their RECORD "
                     f"({edited[0].package}: {edited[0].path}, {edited[0].problem}): a trial "
                     "installs the same versions without the edit; reinstalling "
                     f"{', '.join(packages[:4])} undoes it")
    local = [d.name for d in bad.packages if built_here(d)]
    if local:
        lines.append(f"{', '.join(local[:4])} in {bad_name} were built here from source "
                     "(a bare linux_* wheel tag): a trial installs the index's wheel instead")
    return tuple(lines)
