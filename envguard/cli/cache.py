"""``envguard cache status|save|restore|mark``: the command-line side of compile-cache archives.

Part of the CLI layer (it prints and picks exit codes); the work is done by
:mod:`envguard.cache.store` and the text by :mod:`envguard.render.cache`.
A stale archive (saved under another build) is refused with ExitCode.REFUSED.
"""

from __future__ import annotations

import argparse
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from envguard.cli.options import add_format_option, select_environment
from envguard.cli.output import StderrProgress, note, show, write_stdout
from envguard.exitcodes import ExitCode

if TYPE_CHECKING:
    from envguard.cache.provenance import Marked
    from envguard.model import Snapshot


def add_parsers(sub: argparse._SubParsersAction[Any]) -> None:
    cache = sub.add_parser(
        "cache", help="keep and restore warm torch.compile caches",
        description="Archive the inductor and triton caches under the build that filled "
        "them, and restore them only into the same build (envguard help cache).",
        epilog="exit status: 0 done, 2 bad input or nothing to save, 3 restore refused "
        "(archive of another build), 5 cannot write")
    actions = cache.add_subparsers(dest="cache_command", metavar="ACTION")
    actions.required = True
    store_help = "archive store (default $ENVGUARD_CACHE_DIR/compile-caches)"
    python_help = "act for another interpreter's environment (its build and cache locations)"

    st = actions.add_parser("status", help="cache locations, their validity, and the archives",
                            description="One row per compile-cache location of the "
                            "environment, then the archives in the store.")
    st.add_argument("--python", metavar="PY", help=python_help)
    st.add_argument("--store", metavar="PATH", help=store_help)
    add_format_option(st, help="text (default), json or markdown")
    st.set_defaults(handler=cmd_status)

    sv = actions.add_parser("save", help="archive the inductor (and triton) cache",
                            description="Archive the inductor cache, and the triton cache "
                            "when it holds files, into STORE/NAME, labelled with this build.")
    sv.add_argument("name", nargs="?", metavar="NAME",
                    help="archive name (default <compat key, 12 hex>-<UTC time>)")
    sv.add_argument("--store", metavar="PATH", help=store_help)
    source = sv.add_mutually_exclusive_group()
    source.add_argument("--python", metavar="PY", help=python_help)
    source.add_argument("--from-snapshot", metavar="SNAPSHOT",
                        help="take the build and cache locations from this snapshot (a file, or "
                        "@last-good, @last-good:LOCK, @latest, @run:N)")
    sv.add_argument("--gzip", action="store_true",
                    help="compress (2.5x smaller, slower to save and restore)")
    sv.set_defaults(handler=cmd_save)

    rs = actions.add_parser("restore", help="put an archived cache back in place",
                            description="Verify an archive and swap it in at the cache "
                            "location; the cache that was there is kept beside it.")
    rs.add_argument("name", nargs="?", metavar="NAME",
                    help="archive name (default: the newest saved under this build)")
    rs.add_argument("--store", metavar="PATH", help=store_help)
    rs.add_argument("--python", metavar="PY", help=python_help)
    rs.add_argument("--force", action="store_true",
                    help="restore an archive saved under another build")
    rs.add_argument("--into", metavar="DIR",
                    help="restore into DIR/inductor and DIR/triton instead")
    rs.set_defaults(handler=cmd_restore)

    mk = actions.add_parser("mark", help="record that this build filled the caches",
                            description="Write the current build into the provenance "
                            "marker of every non-empty inductor and triton cache, so cache "
                            "status calls them valid. Use it after warming a cache yourself; "
                            "snapshots never write into a cache.")
    mk.add_argument("--python", metavar="PY", help=python_help)
    mk.set_defaults(handler=cmd_mark)


def _snapshot(python: str | None) -> Snapshot:
    """The build and cache locations only: no integrity check, no git, nothing written."""
    from envguard.probe import collect
    from envguard.probe.options import locations_only

    return collect(locations_only(select_environment(python).python))


def _store(arg: str | None) -> Path:
    from envguard.paths import archive_store

    return Path(arg).expanduser() if arg else archive_store()


def _sizes(snapshot: Snapshot) -> str:
    from envguard.cache.manifest import ARCHIVED_KINDS
    from envguard.units import human_bytes

    found = [c for c in snapshot.caches if c.kind in ARCHIVED_KINDS and c.exists]
    return human_bytes(sum(c.total_bytes for c in found))


def _note(text: str) -> None:
    """The texts are made safe by render.cache already; some are longer than a usual note."""
    note(text, limit=2000)


def cmd_status(args: argparse.Namespace) -> int:
    from envguard.cache import store as cache_store

    st = cache_store.status(_snapshot(args.python), _store(args.store), time.time())
    show(st, args.format)
    return ExitCode.OK


def cmd_save(args: argparse.Namespace) -> int:
    from envguard.cache import manifest as cache_manifest
    from envguard.cache import store as cache_store
    from envguard.render import cache as cache_view
    from envguard.render.sanitize import clean

    started = time.perf_counter()
    ref = None
    if args.from_snapshot:
        from envguard.cli.options import recorded_path
        from envguard.snapshot_file import read_snapshot

        path, _ = recorded_path(args.from_snapshot)
        snapshot = read_snapshot(path, follow=path == args.from_snapshot)
        ref = cache_manifest.SnapshotRef(created_at=snapshot.created_at,
                                      file=str(Path(path).resolve()))
        if snapshot.system.hostname != socket.gethostname():
            _note(f"warning: the snapshot was taken on {clean(snapshot.system.hostname)}, "
                  f"this is {clean(socket.gethostname())}: saving the caches at its paths here")
    else:
        snapshot = _snapshot(args.python)
    store = _store(args.store)
    with StderrProgress() as progress:
        progress.step(f"archiving {_sizes(snapshot)} of compile caches into {store}")
        manifest = cache_store.save(store, snapshot, name=args.name, compress=args.gzip,
                                    snapshot_ref=ref)
    for line in cache_view.save_warnings(manifest):
        _note(f"warning: {line}")
    _mark(lambda: cache_store.mark_saved(snapshot))
    write_stdout("\n".join(cache_view.saved_lines(manifest, str(store / manifest.name),
                                          time.perf_counter() - started)) + "\n")
    return ExitCode.OK


def cmd_restore(args: argparse.Namespace) -> int:
    from envguard.cache import manifest as cache_manifest
    from envguard.cache import store as cache_store
    from envguard.render import cache as cache_view
    from envguard.render.sanitize import clean

    started = time.perf_counter()
    snapshot = _snapshot(args.python)
    current = cache_manifest.Build.of(snapshot)
    store = _store(args.store)
    chosen = cache_manifest.choose(cache_manifest.list_archives(store, current.compat_key),
                                args.name, store)
    manifest = chosen.manifest
    if manifest is None:  # pragma: no cover - choose() returns usable archives only
        raise AssertionError(chosen.problem)
    if not chosen.matches:
        if not args.force:
            _note(cache_view.refusal(chosen.name, manifest.build, current,
                                     named=args.name is not None))
            return ExitCode.REFUSED
        _note(f"--force: restoring {clean(chosen.name)} of another build: "
              f"{cache_view.differences(manifest.build, current)}")
    with StderrProgress() as progress:
        progress.step(f"verifying and restoring {chosen.name}")
        done = cache_store.restore(Path(chosen.path), manifest,
                                   cache_store.targets_of(snapshot, args.into))
    _mark(lambda: cache_store.mark_restored(done, manifest))
    write_stdout("\n".join(cache_view.restored_lines(chosen.name, done,
                                             time.perf_counter() - started)) + "\n")
    return ExitCode.OK


def _mark(action: Callable[[], list[Marked]]) -> None:
    """Provenance after save/restore: the archive work is done, so a marker that cannot
    be written is a warning, not a failure."""
    from envguard.errors import EnvguardError
    from envguard.render.sanitize import clean

    try:
        action()
    except EnvguardError as exc:
        _note(f"warning: build provenance not recorded: {clean(str(exc))}")


def cmd_mark(args: argparse.Namespace) -> int:
    from envguard.cache.provenance import mark_snapshot
    from envguard.render.sanitize import clean

    snapshot = _snapshot(args.python)
    done = mark_snapshot(snapshot)
    if not done:
        from envguard.errors import InputError

        raise InputError("nothing to mark: the inductor and triton caches are missing or "
                         "empty")
    what = {"created": "marked", "added": "marked (it also names other builds)",
            "present": "already marked"}
    version = clean(snapshot.torch.version or "unknown")
    write_stdout("".join(f"{m.kind}: {clean(m.path)}: {what.get(m.result, m.result)} "
                         f"under torch {version}\n" for m in done))
    return ExitCode.OK
