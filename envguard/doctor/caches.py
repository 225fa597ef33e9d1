"""Doctor rules about torch.compile caches, one environment alone: cold (empty, or
recreated after torch was installed), stale (filled under another build), volatile."""

from __future__ import annotations

from collections.abc import Iterator

from envguard.doctor.interface import DoctorRule, Scene, ago
from envguard.explain.interface import Finding, Severity, short
from envguard.explain.queries import cold_story
from envguard.explain.tables import COLD_REMEDY
from envguard.history import CACHE_CREATED, GAP_S, REINSTALLED, parse_iso
from envguard.model import CacheDir
from envguard.units import human_bytes

_VOLATILE_FS = ("tmpfs", "ramfs")


def _inductor(scene: Scene) -> CacheDir | None:
    return next((c for c in scene.snapshot.caches if c.kind == "inductor"), None)


def _recreated(scene: Scene, cache: CacheDir) -> str | None:
    """Why the disk says this non-empty cache was deleted and filled again, or None: its
    oldest entry is newer than envguard's own earlier sighting of it, or newer than a
    reinstall of torch (a cache created after a first install is just the first compile)."""
    created = next((e for e in scene.timeline.events if e.kind == CACHE_CREATED
                    and e.subject == f"inductor {cache.path}"), None)
    if created is None:
        return None
    state = (f"holds {cache.files:,} files ({human_bytes(cache.total_bytes)}) now")
    seen = sorted(s.first_seen for s in cache.populated_under if s.first_seen)
    if seen:
        first = parse_iso(seen[0])
        if first is not None and created.at > first + GAP_S:
            return (f"inductor cache {cache.path}: envguard saw it filled on {seen[0]}, and "
                    f"its oldest entry now is from {ago(scene, created.at)}: it was deleted "
                    f"or emptied since; it {state}")
    reinstall = max((e.at for e in scene.timeline.events
                     if e.subject == "torch" and e.kind == REINSTALLED), default=None)
    if reinstall is not None and created.at > reinstall + GAP_S:
        return (f"inductor cache {cache.path}: its oldest entry is from "
                f"{ago(scene, created.at)}, after torch was reinstalled "
                f"({ago(scene, reinstall)}): whatever it held before is gone; it {state}")
    return None


def _ever_used(scene: Scene, cache: CacheDir) -> bool:
    """Whether anything says torch.compile is used here: envguard saw this cache filled
    (a sighting under some build), or the disk's history shows it created."""
    return bool(cache.populated_under) or any(
        e.kind == CACHE_CREATED and e.subject == f"inductor {cache.path}"
        for e in scene.timeline.events)


def compile_cache_cold(scene: Scene) -> Iterator[Finding]:
    snap = scene.snapshot
    if not snap.torch.present:
        return  # nothing here compiles: an empty cache is no news
    cache = _inductor(scene)
    if cache is None:
        return
    evidence: list[str] = []
    if not cache.exists or not cache.files:
        if not _ever_used(scene, cache):
            return  # nothing says this machine compiles: no essay about a cache it never had
        evidence.append(f"inductor cache {cache.path}: "
                        + ("missing" if not cache.exists else "empty")
                        + f" (location from {cache.source})")
    else:
        why = _recreated(scene, cache)
        if why is None:
            return  # created after a plain install: the first compile, as on any machine
        evidence.append(why)
    tail, explanation = cold_story(snap)
    recreated = cache.exists and bool(cache.files)
    yield Finding(
        # A missing or empty cache is how every machine starts: a note. One recreated after
        # torch was installed was deleted on the way: that is news.
        rule="compile-cache-cold", severity=Severity.WARNING if recreated else Severity.INFO,
        title="the torch.compile cache is "
              + ("missing" if not cache.exists else "empty" if not cache.files
                 else "recreated: deleted since it was last filled") + tail,
        explanation=explanation, evidence=tuple(evidence), remedy=COLD_REMEDY, weight=98)


def compile_cache_stale(scene: Scene) -> Iterator[Finding]:
    key = scene.snapshot.torch.compat_key
    for cache in scene.snapshot.caches:
        if key is None or not cache.exists or not cache.files or not cache.populated_under:
            continue
        if any(s.compat_key == key for s in cache.populated_under):
            continue
        yield Finding(
            rule="compile-cache-stale", severity=Severity.WARNING,
            title=f"the {cache.kind} cache was filled by another torch/triton build and will "
                  "miss silently",
            explanation="Inductor's cache keys include a hash of every torch source file, "
                        "triton's source hash and the GPU with its CUDA version. Entries "
                        "written by another build are never hit and nothing says so.",
            evidence=(f"{cache.kind} cache {cache.path}: {cache.files:,} files",
                      *(f"seen filled under torch {s.torch_version} (git "
                        f"{short(s.torch_git_version)}) since {s.first_seen}"
                        for s in cache.populated_under[:3]),
                      f"this build's compile-compat key: {short(key, 16)}"),
            remedy=("envguard cache restore, if an archive of this build exists",
                    "otherwise warm it again single-threaded (dflash-train --warmup-only), "
                    "then envguard cache save"),
            weight=80)


def compile_cache_volatile(scene: Scene) -> Iterator[Finding]:
    if not scene.snapshot.torch.present:
        return
    for cache in scene.snapshot.caches:
        if cache.kind not in ("inductor", "triton") or cache.filesystem not in _VOLATILE_FS:
            continue
        var = "TORCHINDUCTOR_CACHE_DIR" if cache.kind == "inductor" else "TRITON_CACHE_DIR"
        yield Finding(
            rule="compile-cache-volatile", severity=Severity.INFO,
            title=f"the {cache.kind} cache {cache.path} is on {cache.filesystem} and vanishes "
                  "at reboot",
            explanation="Every reboot or tmp cleaning means another cold start.",
            evidence=(f"{cache.kind}: {cache.path} ({cache.filesystem})",),
            remedy=(f"export {var}=$HOME/.cache/"
                    f"{'torchinductor' if cache.kind == 'inductor' else 'triton'}",),
            weight=10)


RULES = (
    DoctorRule(id="compile-cache-cold", title="compile cache empty or recreated",
               check=compile_cache_cold),
    DoctorRule(id="compile-cache-stale", title="compile cache from another build",
               check=compile_cache_stale),
    DoctorRule(id="compile-cache-volatile", title="compile cache on tmpfs",
               check=compile_cache_volatile),
)
