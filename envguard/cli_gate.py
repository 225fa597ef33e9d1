"""``envguard lock``, ``check`` and ``run``: the command-line side of lockfiles and the gate.

Part of the CLI layer (it prints); the decisions live in :mod:`envguard.lock` and
:mod:`envguard.gate`.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from envguard.errors import InputError
from envguard.exitcodes import ExitCode
from envguard.render.formats import OutputFormat

if TYPE_CHECKING:
    from envguard.gate import GateResult

# The policies, repeated here so that building the parser imports nothing heavy
# (envguard.lock needs packaging.markers: 20-60 ms on every command otherwise).
CACHE_POLICIES = ("require-warm", "warn-if-cold", "ignore")


def add_parsers(sub: argparse._SubParsersAction[Any]) -> None:
    lock = sub.add_parser(
        "lock", help="bless the current environment as known-good for a command",
        description="Write or update lockfiles/NAME.toml with this environment as one entry "
        "(other machines' entries are kept).")
    lock.add_argument("name", help="the lock's name: the command it guards (dflash-train)")
    lock.add_argument("--from", dest="from_snapshot", metavar="SNAPSHOT",
                      help="lock the environment recorded in this snapshot instead")
    lock.add_argument("--python", metavar="PY", help="lock another interpreter's environment")
    lock.add_argument("--lock", metavar="PATH", help="lockfile path (default lockfiles/NAME.toml)")
    lock.add_argument("--entry", metavar="ID", help="entry id (default <host>-py<X.Y>-<cuda>)")
    lock.add_argument("--distribution", metavar="DIST",
                      help="the command's distribution (default: found from its entry point)")
    lock.add_argument("--extra", dest="extras", action="append", default=None, metavar="EXTRA",
                      help="extras of the distribution the command needs (repeatable)")
    lock.add_argument("--file", dest="files", action="append", default=None, metavar="GLOB",
                      help="files to pin by md5/sha256, relative to the project (repeatable)")
    lock.add_argument("--cache-policy", choices=CACHE_POLICIES, default=None)
    lock.add_argument("--forbid", action="append", default=None, metavar="PATTERN",
                      help="forbidden distributions (default: serving/inference stacks)")
    lock.set_defaults(handler=cmd_lock)

    chk = sub.add_parser("check", help="does this environment match a lock?",
                         epilog="exit status: 0 match, 1 mismatch, 2 error")
    chk.add_argument("name", nargs="?", help="lock name, looked up in ./lockfiles")
    chk.add_argument("--lock", metavar="PATH")
    chk.add_argument("--python", metavar="PY")
    chk.add_argument("--format", choices=[f.value for f in OutputFormat], default="text")
    chk.add_argument("--strict", action="store_true",
                     help="every distribution must match, not only the command's closure")
    chk.set_defaults(handler=cmd_check)

    run = sub.add_parser(
        "run", help="run a command only if the environment matches its lock",
        usage="envguard run [--lock PATH] [--python PY] [--force] [--strict] -- CMD [ARGS...]",
        epilog="exit status: the command's own on a match; 3 when refused; 2 bad input")
    run.add_argument("--lock", metavar="PATH")
    run.add_argument("--python", metavar="PY")
    run.add_argument("--force", action="store_true", help="run even if it does not match")
    run.add_argument("--strict", action="store_true",
                     help="every distribution must match, not only the command's closure")
    run.add_argument("argv", nargs=argparse.REMAINDER, metavar="CMD")
    run.set_defaults(handler=cmd_run)


def cmd_lock(args: argparse.Namespace) -> int:
    from envguard.atomic import write_text_atomic
    from envguard.gate import project_root_of, read_lock
    from envguard.lock import (
        DEFAULT_FORBIDDEN,
        Lock,
        build_entry,
        dump_lock,
        hash_files,
        script_owner,
        validate_name,
    )
    from envguard.store import read_snapshot

    name = validate_name(args.name)
    path = Path(args.lock) if args.lock else Path("lockfiles") / f"{name}.toml"
    root = project_root_of(path)
    existing = read_lock(path) if path.exists() else None
    lock = existing or Lock(name=name, command=name, distribution=args.distribution or "")
    lock = dataclasses.replace(
        lock,
        distribution=args.distribution or lock.distribution,
        extras=tuple(args.extras) if args.extras is not None else lock.extras,
        file_patterns=tuple(args.files) if args.files is not None else lock.file_patterns,
        cache_policy=args.cache_policy or lock.cache_policy,
        forbidden=tuple(args.forbid) if args.forbid is not None else
        (lock.forbidden if existing else DEFAULT_FORBIDDEN))
    if args.from_snapshot:
        snapshot = read_snapshot(args.from_snapshot)
    else:
        from envguard.gate import gate_snapshot_options
        from envguard.probe import collect

        snapshot = collect(gate_snapshot_options(lock, root, python=args.python, fast=False,
                                                 for_lock=True))
    if not lock.distribution:
        owner = script_owner(snapshot, lock.command)
        if owner is None:
            raise InputError(f"no installed distribution provides the command {lock.command!r};"
                             " pass --distribution")
        lock = dataclasses.replace(lock, distribution=owner[0],
                                   extras=lock.extras or owner[1])
    forbidden = lock.forbidden_installed(snapshot)
    if forbidden:
        raise InputError(f"will not lock an environment with forbidden packages installed: "
                         f"{', '.join(forbidden)} (uninstall them, or change --forbid)")
    entry = build_entry(snapshot, lock, entry_id=args.entry, project_root=root)
    lock = dataclasses.replace(lock, files=hash_files(lock, root))
    snap_rel = f"{name}.snapshots/{entry.id}.json"
    write_text_atomic(path.parent / snap_rel, snapshot.to_json())
    entry = dataclasses.replace(entry, snapshot_file=snap_rel)
    lock = lock.with_entry(entry)
    write_text_atomic(path, dump_lock(lock))
    verb = "replaced" if existing and any(e.id == entry.id for e in existing.entries) else "added"
    print(f"{path}: {verb} entry {entry.id} ({len(entry.packages)} packages; "
          f"{len(lock.entries)} entries in all; {len(lock.files)} files pinned)")
    return ExitCode.OK


def _render(result: GateResult, fmt: OutputFormat, *, stream: TextIO) -> None:
    from envguard.render.sanitize import clean
    from envguard.report import DiffReport

    closest = result.matched or result.closest
    if closest is None:
        raise InputError(f"{result.lock_path}: the lock has no environment entries")
    blocking = result.cache_note if (result.cache_note is not None and not result.passed
                                     and result.matched is not None) else None
    report = DiffReport(old_name=f"{result.lock_path} [{closest.entry.id}]",
                        new_name="this environment", diff=closest.diff,
                        findings=result.findings,
                        refused_by=blocking.title if blocking is not None else None)
    if fmt is OutputFormat.JSON:
        from envguard.render import diff_json

        print(diff_json.render(report), end="", file=stream)
    elif fmt is OutputFormat.MARKDOWN:
        from envguard.render import diff_markdown

        print(diff_markdown.render(report), end="", file=stream)
    elif result.passed:
        # Plain text on the happy path: rich costs 40 ms of the gate's budget.
        print(f"envguard: matches entry {clean(closest.entry.id)} of "
              f"{clean(result.lock_path)}", file=stream)
        for f in result.findings:
            print(f"envguard: warning: {clean(f.title, 300)} [{f.rule}]", file=stream)
    else:
        from rich.console import Console

        from envguard.render import diff_text

        Console(file=stream, highlight=False).print(diff_text.render(report))


def cmd_check(args: argparse.Namespace) -> int:
    from envguard.gate import check_command

    if not args.name and not args.lock:
        raise InputError("name a lock (envguard check NAME) or pass --lock PATH")
    result = check_command(args.name or "", lock=args.lock, python=args.python,
                           strict=args.strict)
    _render(result, OutputFormat(args.format), stream=sys.stdout)
    return ExitCode.OK if result.passed else ExitCode.DRIFT


def cmd_run(args: argparse.Namespace) -> int:
    from envguard.gate import VERIFIED_ENV, check_command, interpreter_of
    from envguard.runner import record_run, run_child

    argv = list(args.argv)
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        raise InputError("no command: envguard run [options] -- CMD [ARGS...]")
    name = os.path.basename(argv[0])
    result = check_command(name, lock=args.lock, python=args.python or interpreter_of(argv[0]),
                           strict=args.strict)
    lock, path, snapshot = result.lock, result.lock_path, result.snapshot
    entry = result.matched.entry.id if result.matched else None
    meta = {"schema": "envguard.run/1", "argv": argv, "lock": lock.name,
            "lockfile": str(path), "entry": entry, "passed": result.passed,
            "forced": args.force and not result.passed,
            "findings": [f.rule for f in result.findings]}
    if not result.passed and not args.force:
        _render(result, OutputFormat.TEXT, stream=sys.stderr)
        print(f"envguard: refused to run {name}: the environment does not match "
              f"{path} (use --force to run anyway)", file=sys.stderr)
        record_run(snapshot, {**meta, "exit_code": None}, Path.cwd(), good=False)
        return ExitCode.REFUSED
    if not result.passed:
        print(f"envguard: --force: running {name} although the environment does not match "
              f"{path}", file=sys.stderr)
    elif result.findings:
        _render(result, OutputFormat.TEXT, stream=sys.stderr)
    env = dict(os.environ)
    if result.passed:
        from envguard.lock import snapshot_digest

        env[VERIFIED_ENV] = f"{lock.name}:{entry}:{snapshot_digest(snapshot)}"
    code = run_child(argv, env)
    record_run(snapshot, {**meta, "exit_code": code}, Path.cwd(), good=result.passed)
    return code
