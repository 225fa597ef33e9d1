"""``envguard doctor --fix``: the fixes that are safe and reversible, as a plan, then run.

Only two kinds qualify:

- a package whose installed files differ from its RECORD (size, content, missing) is
  reinstalled at the version installed now (from the wheel file or URL it came from, when
  it did not come from an index), without touching its dependencies: the
  files come back as the wheel has them (to undo: reinstall whatever you had; the plan
  names the files that will be replaced, so an edit you want can be copied first). When
  the edit is in uv's cache too (an edited file hard-linked from it:
  :func:`~envguard.explain.queries.edit_in_uv_cache`), the package is dropped from uv's
  cache first (``uv cache clean``), or the reinstall would link the edited file back;
- envguard's own build marker in a compile cache that holds nothing else is removed
  (recreated by the next ``envguard cache mark`` or warm-up).

Everything else (removing packages, changing drivers or variables) changes what the
user chose, and stays a remedy to read.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Sequence

from envguard.doctor import DoctorReport
from envguard.explain.queries import edit_in_uv_cache
from envguard.explain.remedies import reinstall_command, uv_cache_clean
from envguard.frozen import frozen
from envguard.probe.caches import MARKER_NAME

_CHANGED = frozenset({"size", "hash", "missing"})
FIX_TIMEOUT_S = 900.0


@frozen
class FixStep:
    rule: str
    action: str
    """What it does, one line."""
    argv: tuple[str, ...] = ()
    """The command it runs (empty: it removes ``path``)."""
    path: str | None = None
    undo: str = ""


@frozen
class FixResult:
    step: FixStep
    ok: bool
    message: str


def plan(report: DoctorReport, python: str, uv: str = "uv",
         index: Sequence[str] = ()) -> tuple[FixStep, ...]:
    """The safe fixes for ``report``'s environment (``python``: its interpreter; ``index``:
    uv's index options the user gave, ``--find-links DIR --offline`` and the like).

    Names, versions and URLs come from the environment's METADATA and direct_url.json:
    each is checked by :mod:`envguard.explain.remedies`, whose builder also makes the
    printed remedies; one that cannot be a word of a command raises
    :class:`~envguard.explain.remedies.UnsafeValue` (exit 2), and nothing runs."""
    snap = report.snapshot
    steps: list[FixStep] = []
    broken: dict[str, list[str]] = {}
    for issue in snap.integrity.issues:
        if issue.problem in _CHANGED:
            broken.setdefault(issue.package, []).append(issue.path)
    for name in sorted(broken):
        dist = snap.package(name)
        if dist is None or not dist.version or dist.editable:
            continue
        argv = reinstall_command(dist, uv=uv, python=python, options=index)
        if argv is None:
            continue  # from a folder or a VCS checkout: nothing exact to reinstall from
        files = broken[name]
        if edit_in_uv_cache(snap, name):
            steps.append(FixStep(
                rule="installed-files-modified",
                action=f"drop {name} from uv's cache: the edited file is the cache's copy too "
                       "(hard-linked), so a reinstall alone would link it back; uv fetches "
                       "the wheel again (from the index or --find-links)",
                argv=tuple(uv_cache_clean([name], uv=uv)),
                undo="nothing to undo: uv unpacks the wheel into its cache again when it "
                     "next installs it"))
        steps.append(FixStep(
            rule="installed-files-modified",
            action=f"reinstall {name} {dist.version} (its {len(files)} changed file(s) come "
                   f"back as the wheel has them: {', '.join(files[:3])}"
                   + (" ..." if len(files) > 3 else "") + ")",
            argv=tuple(argv),
            undo="copy an edited file away before fixing if you want it back; the "
                 "reinstall changes nothing else"))
    for cache in snap.caches:
        marker = os.path.join(cache.path, MARKER_NAME)
        if cache.exists and cache.files == 0 and os.path.isfile(marker):
            steps.append(FixStep(
                rule="compile-cache-stale",
                action=f"remove envguard's build marker from the empty {cache.kind} cache "
                       f"{cache.path}", path=marker,
                undo="envguard cache mark writes it again"))
    return tuple(steps)


def apply(steps: tuple[FixStep, ...], echo: Callable[[str], None]) -> list[FixResult]:
    """Run each step in order; a failed step is reported and the next one still runs."""
    results = []
    for step in steps:
        echo(step.action)
        if step.path is not None:
            try:
                os.unlink(step.path)
                results.append(FixResult(step=step, ok=True, message="removed"))
            except OSError as exc:
                results.append(FixResult(step=step, ok=False, message=exc.strerror or str(exc)))
            continue
        try:
            proc = subprocess.run(list(step.argv), capture_output=True, text=True,
                                  timeout=FIX_TIMEOUT_S, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            results.append(FixResult(step=step, ok=False, message=str(exc)))
            continue
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or [""]
        results.append(FixResult(step=step, ok=proc.returncode == 0,
                                 message=tail[0] if proc.returncode else "done"))
    return results
