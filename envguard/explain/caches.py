"""Rules about torch.compile caches: cold, stale, volatile.

The facts quoted come from docs/COMPILE-RACE.md: measured on the
H200 machine with torch 2.11.0+cu130 (the incident's build) and on CPU with 2.13.
"""

from __future__ import annotations

from collections.abc import Iterator

from envguard.explain.interface import Context, Finding, Rule, Severity, short
from envguard.explain.queries import cold_story
from envguard.explain.tables import COLD_REMEDY
from envguard.model import CacheDir
from envguard.units import human_bytes

_COMPILED = ("inductor", "triton")
_VOLATILE_FS = ("tmpfs", "ramfs")
_PERSISTENT = {"inductor": "torchinductor", "triton": "triton"}
_VOLATILE_DIRS = ("/tmp/", "/var/tmp/", "/dev/shm/")  # noqa: S108 - names, not used for files

def _describe(c: CacheDir | None) -> str:
    if c is None or not c.exists:
        return "missing"
    if not c.files:
        return "empty"
    return f"{human_bytes(c.total_bytes)} in {c.files:,} files"


def _pairs(ctx: Context) -> Iterator[tuple[str, CacheDir | None, CacheDir | None]]:
    old = {c.kind: c for c in ctx.old.caches}
    new = {c.kind: c for c in ctx.new.caches}
    for kind in _COMPILED:
        yield kind, old.get(kind), new.get(kind)


def _is_cold(old: CacheDir | None, new: CacheDir | None) -> bool:
    had = old is not None and old.exists and old.files > 0
    has = new is not None and new.exists and new.files > 0
    return had and not has


def compile_cache_cold(ctx: Context) -> Iterator[Finding]:
    evidence, changes = [], []
    for kind, old, new in _pairs(ctx):
        if old is None or not _is_cold(old, new):
            continue
        line = f"{kind} cache {old.path}: {_describe(old)} → {_describe(new)}"
        if new is not None and new.path != old.path:
            line = (f"{kind} cache moved {old.path} ({_describe(old)}) → {new.path} "
                    f"({_describe(new)}), set by {new.source}")
        evidence.append(line)
        changes += ctx.diff.find("caches", kind)
    if not evidence:
        return
    title_tail, explanation = cold_story(ctx.new)
    yield Finding(
        rule="compile-cache-cold",
        severity=Severity.CRITICAL,
        title="the torch.compile cache that held data is now "
              + ("gone" if "missing" in evidence[0] else "empty") + title_tail,
        explanation=explanation,
        evidence=tuple(evidence),
        remedy=COLD_REMEDY,
        changes=tuple(changes),
        weight=98,
    )


def compile_cache_stale(ctx: Context) -> Iterator[Finding]:
    key = ctx.new.torch.compat_key
    key_change = ctx.diff.first("torch", "compat_key")
    for kind, old, new in _pairs(ctx):
        if new is None or not new.exists or not new.files or _is_cold(old, new):
            continue
        known = [s.compat_key for s in new.populated_under]
        other_builds = [s for s in new.populated_under if s.compat_key != key]
        # Only news counts: a cache that was equally stale in the good snapshot is not a
        # difference (and a snapshot diffed with itself has no findings).
        was_known = [s.compat_key for s in old.populated_under] if old is not None else []
        stale_by_marker = bool(known) and key is not None and (key not in known or
                                                               new.marker == "added") \
            and known != was_known
        stale_by_diff = key_change is not None and old is not None and old.exists \
            and old.files > 0
        if not (stale_by_marker and other_builds) and not stale_by_diff:
            continue
        evidence = [f"{kind} cache {new.path}: {_describe(new)}"]
        for stamp in other_builds:
            evidence.append(f"populated under torch {stamp.torch_version} "
                            f"(git {short(stamp.torch_git_version)}), triton "
                            f"{stamp.triton_version}, since {stamp.first_seen}")
        if key_change is not None:
            evidence.append(f"compile-compat key: {short(key_change.old, 16)} → "
                            f"{short(key_change.new, 16)}")
        yield Finding(
            rule="compile-cache-stale",
            severity=Severity.WARNING,
            title=f"the {kind} cache was filled by another torch/triton build and will miss "
                  "silently",
            explanation=(
                "Inductor's cache keys include a hash of every torch source file, triton's "
                "source hash and the GPU with its CUDA version. Entries written by another "
                "build are never hit and no warning is printed: the process compiles cold "
                "(with the risks of compile-cache-cold) while the folder looks warm."
            ),
            evidence=tuple(evidence),
            remedy=(
                "envguard cache restore, if an archive saved under the current build exists "
                "(envguard cache status lists them); it refuses archives of other builds",
                "otherwise warm the cache again with the current build, single-threaded, "
                "before starting threads (dflash-train --warmup-only), then envguard cache save",
                f"optionally clear the old entries to save space: rm -rf {new.path}",
            ),
            changes=tuple(c for c in (key_change,) if c is not None),
            weight=80,
        )


def _volatile(c: CacheDir) -> bool:
    return c.filesystem in _VOLATILE_FS or (c.path.rstrip("/") + "/").startswith(_VOLATILE_DIRS)


def compile_cache_volatile(ctx: Context) -> Iterator[Finding]:
    """Only when the cache's state changed: a self-diff must stay silent."""
    for kind, old, new in _pairs(ctx):
        if new is None or not _volatile(new):
            continue
        moved = old is not None and old.path != new.path
        relevant = _is_cold(old, new) or moved or (old is not None and not _volatile(old))
        if not relevant:
            continue
        var = "TORCHINDUCTOR_CACHE_DIR" if kind == "inductor" else "TRITON_CACHE_DIR"
        yield Finding(
            rule="compile-cache-volatile",
            severity=Severity.INFO,
            title=f"the {kind} cache lives in {new.path}"
                  + (f" on {new.filesystem}" if new.filesystem in _VOLATILE_FS else "")
                  + " and vanishes on reboot or tmp cleaning",
            explanation=(
                "torch's default cache folder is <tempdir>/torchinductor_<user>. /tmp is "
                "cleaned at reboot or by tmp cleaners, and on tmpfs it also uses RAM; every "
                "cleaning means another cold start."
            ),
            evidence=(f"{kind}: {new.path} ({new.filesystem or 'unknown filesystem'}), "
                      f"location from {new.source}",),
            remedy=(f"export {var}=$HOME/.cache/{_PERSISTENT[kind]} (persistent, per user) in "
                    "the launch environment",),
            weight=10,
        )


RULES = (
    Rule(id="compile-cache-cold", title="compile cache emptied or moved",
         check=compile_cache_cold,
         keywords=("is_fx_symbolic_tracing", "symbolically trace", "_is_fx_tracing_flag",
                   "dynamo-optimized", "hang", "hung", "stuck", "deadlock", "freeze", "timeout",
                   "watchdog", "compile", "inductor", "dynamo", "flex_attention", "first step",
                   "slow start", "recompil")),
    Rule(id="compile-cache-stale", title="compile cache from another build",
         check=compile_cache_stale,
         keywords=("cache miss", "recompil", "slow start", "first step", "compile", "inductor",
                   "fxgraph_cache_miss")),
    Rule(id="compile-cache-volatile", title="compile cache on tmpfs or /tmp",
         check=compile_cache_volatile, keywords=("reboot", "tmp", "cache")),
)
