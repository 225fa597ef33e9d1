"""torch's portable Mega-Cache for the trainer: saved after the warm-up, keyed by the
environment's compile-compat key, loaded at start when one matches.

The key is envguard's (``envguard snapshot`` records it as ``torch.compat_key``): torch
version and git commit, CUDA, triton version and fingerprint, GPU names and the digests
of torch's sources. Inductor silently misses on artifacts of another build, so an
artifact is only ever loaded under the key it was saved with; a store holds one file per
key, ``<store>/<key>.bin``, with a small JSON manifest beside it.

Loading an artifact costs seconds (6.6 s for the 8B trainer's), which a machine whose
own inductor folder already holds those kernels need not pay: after a save or a load,
a marker named after the key is left in the inductor folder, and the trainer skips the
Mega-Cache where it finds one (:meth:`MegaCache.local_is_warm`). Deleting the folder
deletes the marker with it. :func:`before_warmup` and :meth:`WarmUpCache.after_warmup`
are the trainer's two calls around its warm-up.
"""

from __future__ import annotations

import functools
import json
import os
import stat
import time
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

import torch

from dflash.errors import MegaCacheError
from envguard.atomic import write_bytes_atomic, write_text_atomic
from envguard.input_file import read_bounded


def default_store() -> Path:
    from envguard.paths import user_dir

    return user_dir() / "mega-cache"


_GIVEN: dict[str, str] = {}


def use_compat_key_of(snapshot_json: str) -> None:
    """Take this interpreter's compile-compat key from a snapshot of it this process holds
    already (the environment gate's, which the run keeps as env.json), so that
    :func:`current_compat_key` takes no second snapshot (0.05-0.4 s of every start). A
    document without a ``sha256:`` key at ``torch.compat_key`` changes nothing."""
    with suppress(ValueError, TypeError, KeyError, AttributeError):
        key = json.loads(snapshot_json)["torch"]["compat_key"]
        if isinstance(key, str) and key.startswith("sha256:"):
            _GIVEN["key"] = key


def current_compat_key() -> str | None:
    """This interpreter's compile-compat key: a snapshot's given by
    :func:`use_compat_key_of`, else read from files (no extra torch work), once a process
    (the start asks twice: :func:`compile_will_run`, :func:`before_warmup`)."""
    return _GIVEN.get("key") or _collected_compat_key()


@functools.cache
def _collected_compat_key() -> str | None:
    from envguard.probe import SnapshotOptions, collect

    snapshot = collect(SnapshotOptions(verify="none", use_project_config=False))
    return snapshot.torch.compat_key


@dataclass(frozen=True, slots=True)
class MegaCache:
    store: Path
    key: str

    @property
    def path(self) -> Path:
        return self.store / (self.key.replace("sha256:", "")[:32] + ".bin")

    def _marker(self) -> Path:
        from torch._inductor.runtime.cache_dir_utils import cache_dir

        return Path(cache_dir()) / f"dflash-mega-{self.path.stem}"

    def local_is_warm(self) -> bool:
        """Whether this machine's inductor folder already took this key's artifact in (a
        save or load by an earlier process left the marker)."""
        try:
            return self._marker().is_file()
        except (OSError, ImportError):
            return False

    def mark_local(self) -> None:
        """Leave the marker (best effort: without it the next process loads again)."""
        with suppress(OSError, ImportError):
            self._marker().touch()

    def load(self) -> float | None:
        """Load a matching artifact into torch's caches; seconds taken, or None if none.
        torch unpickles it, so it is loaded only from a private store
        (:func:`untrusted`); otherwise a MegaCacheError says why, and the warm-up compiles."""
        if not self.path.is_file():
            return None
        reason = untrusted(self.path)
        if reason is not None:
            raise MegaCacheError(f"{self.path}: not loaded, {reason}: torch would unpickle "
                                 "it (compiling cold instead)")
        start = time.perf_counter()
        try:
            info = torch.compiler.load_cache_artifacts(
                read_bounded(self.path, limit=ARTIFACT_BYTES, what="compile artifact",
                             follow=False))
        except Exception as exc:  # noqa: BLE001 - reported as one line
            raise MegaCacheError(f"{self.path}: cannot load the compile artifact: "
                                 f"{str(exc).splitlines()[0] if str(exc) else exc!r}") from None
        if info is None:  # torch logs why and returns None for an unreadable artifact
            raise MegaCacheError(f"{self.path}: not a readable torch compile artifact "
                                 "(corrupt or truncated); delete it and warm up again")
        return time.perf_counter() - start

    def save(self) -> int:
        """Save what this process compiled; bytes written (0 when there is nothing). The
        artifact is 0600 and a store made here 0700 (:func:`untrusted` loads no other)."""
        artifacts = torch.compiler.save_cache_artifacts()
        if artifacts is None or not artifacts[0]:
            return 0
        data = artifacts[0]
        from envguard.paths import why_not_private

        why_not_private(self.store)  # makes a missing store (and parents) 0700
        write_bytes_atomic(self.path, data, mode=0o600)  # loadable by this user alone
        manifest = {"compat_key": self.key, "bytes": len(data), "torch": torch.__version__,
                    "torch_git": torch.version.git_version,
                    "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        write_text_atomic(self.path.with_suffix(".json"), json.dumps(manifest, indent=2) + "\n")
        return len(data)


ARTIFACT_BYTES = 16 << 30
"""16 GiB: the largest compile artifact read (the 8B trainer's is tens of MB)."""


def untrusted(artifact: Path) -> str | None:
    """Why ``artifact`` may not be unpickled, or None: its store is private as envguard's
    bytecode folder is (:func:`envguard.paths.why_not_private`: owned by this user, not
    writable by group or others, nor its parent unless sticky), and the file is a regular
    file of this user's, not a link, not writable by group or others. A store on a shared
    disk that another user can write is used for saving only."""
    from envguard.paths import why_not_private

    folder = why_not_private(artifact.parent)
    if folder is not None:
        return folder
    try:
        st = os.lstat(artifact)
    except OSError as exc:
        return f"cannot read it: {exc.strerror or exc}"
    if not stat.S_ISREG(st.st_mode):
        return "it is a link or not a regular file"
    if hasattr(os, "geteuid") and st.st_uid != os.geteuid():
        return f"it is owned by uid {st.st_uid}, not by this user"
    if st.st_mode & 0o022:
        return f"it is writable by group or others (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def for_setting(setting: str) -> MegaCache | None:
    """``off`` → None; ``auto`` → the default store; anything else is a store folder.
    None too when the key cannot be computed (then nothing could be matched safely)."""
    if setting == "off":
        return None
    key = current_compat_key()
    if key is None:
        return None
    return MegaCache(default_store() if setting == "auto" else Path(setting), key)


@dataclass(slots=True)
class WarmUpCache:
    """The Mega-Cache around one warm-up of the trainer (:func:`before_warmup`)."""

    mega: MegaCache
    loaded_seconds: float | None = None
    """Seconds the matching artifact took to load; None when there was none to load."""
    problem: str | None = None
    """Why an artifact that was there could not be loaded (the warm-up compiles cold)."""

    def after_warmup(self) -> int:
        """After the seal: save what a cold warm-up compiled, and leave the marker once this
        machine's inductor folder holds the kernels. Bytes saved (0 after a load)."""
        saved = self.mega.save() if self.loaded_seconds is None else 0
        if self.loaded_seconds is not None or saved:
            self.mega.mark_local()
        return saved


def compile_will_run(setting: str) -> bool:
    """Whether the warm-up will compile for real: a Mega-Cache is on, and neither this
    machine's inductor folder holds its key's kernels nor the store an artifact to load.
    False where that cannot be known (the setting is off, no key): nothing changes there."""
    mega = for_setting(setting)
    return mega is not None and not mega.local_is_warm() and not (
        mega.path.is_file() and untrusted(mega.path) is None)


def before_warmup(setting: str) -> WarmUpCache | None:
    """Before the warm-up: load the artifact of this environment's key. None when the
    setting is ``off``, the key cannot be computed, or this machine's inductor folder
    holds the kernels already; an artifact that cannot be loaded is a ``problem``."""
    mega = for_setting(setting)
    if mega is None or mega.local_is_warm():
        return None
    cache = WarmUpCache(mega)
    try:
        cache.loaded_seconds = mega.load()
    except MegaCacheError as exc:  # compile cold instead, and say so
        cache.problem = str(exc)
    return cache
