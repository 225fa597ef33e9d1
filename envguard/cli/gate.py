"""``envguard lock``, ``check`` and ``run``: the command-line side of lockfiles and the gate.

Part of the CLI layer (it prints); the decisions live in :mod:`envguard.gate`.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from envguard.cli._common import (
    StreamScreen,
    add_format_option,
    note,
    say_environment,
    select_environment,
    show,
    write_stdout,
)
from envguard.errors import InputError
from envguard.exitcodes import ExitCode

# The tables, not envguard.gate.lockfile: building the parser must import nothing heavy
# (the lockfile needs packaging.markers: 20-60 ms on every command otherwise).
from envguard.explain.tables import CACHE_POLICIES, is_lock_path
from envguard.render.formats import OutputFormat

if TYPE_CHECKING:
    from envguard.gate.check import GateResult
    from envguard.model import Snapshot
    from envguard.runs.store import RunRecord

LOCK_HELP = ("the lockfile, or a lock's name (default: lockfiles/NAME.toml here or in a "
             "parent folder, NAME the command's basename, else the one bundled with envguard)")


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
    lock.add_argument("--cache-policy", choices=CACHE_POLICIES, default=None,
                      help="what check/run do about cold compile caches: refuse "
                      "(require-warm), warn (warn-if-cold, the default) or nothing (ignore)")
    lock.add_argument("--forbid", action="append", default=None, metavar="PATTERN",
                      help="forbidden distributions (default: serving/inference stacks)")
    lock.set_defaults(handler=cmd_lock)

    chk = sub.add_parser("check", help="does this environment match a lock?",
                         epilog="exit status: 0 match, 1 mismatch, 2 error")
    chk.add_argument("name", nargs="?", help="lock name, looked up in ./lockfiles")
    chk.add_argument("--lock", metavar="PATH", help=LOCK_HELP)
    chk.add_argument("--python", metavar="PY",
                     help="check another interpreter or venv folder (default: see "
                     "'Which environment' in docs/CLI.md)")
    add_format_option(chk, help="text (default), json (envguard.diff/1 against the closest "
                                "entry) or markdown")
    chk.add_argument("--strict", action="store_true",
                     help="every distribution must match, not only the command's closure")
    chk.set_defaults(handler=cmd_check)

    run = sub.add_parser(
        "run", help="run a command only if the environment matches its lock",
        usage="envguard run [--lock PATH] [--python PY] [--force] [--strict] -- CMD [ARGS...]",
        epilog="exit status: the command's own on a match; 3 when refused; 2 bad input")
    run.add_argument("--lock", metavar="PATH", help=LOCK_HELP)
    run.add_argument("--python", metavar="PY",
                     help="the environment CMD runs in (default: the Python CMD runs "
                     "under: its shebang, or python on PATH; else as for check)")
    run.add_argument("--force", action="store_true", help="run even if it does not match")
    run.add_argument("--strict", action="store_true",
                     help="every distribution must match, not only the command's closure")
    run.add_argument("argv", nargs=argparse.REMAINDER, metavar="CMD",
                     help="the command and its arguments, after --, passed on unchanged")
    run.set_defaults(handler=cmd_run)


def _utf8_values(args: argparse.Namespace) -> None:
    """The lock's words go into a UTF-8 TOML file: a name, pattern or extra that is not
    UTF-8 (bytes on the command line that Python keeps as surrogate escapes) is refused
    here with one line, exit 2, instead of failing when the lock is written."""
    for option, value in (("NAME", args.name), ("--distribution", args.distribution),
                          ("--entry", args.entry), *(("--file", v) for v in args.files or ()),
                          *(("--forbid", v) for v in args.forbid or ()),
                          *(("--extra", v) for v in args.extras or ())):
        try:
            (value or "").encode("utf-8")
        except UnicodeEncodeError:
            raise InputError(f"{option} {value!a}: not valid UTF-8; a lock holds "
                             "UTF-8 text only") from None


def cmd_lock(args: argparse.Namespace) -> int:
    from envguard.gate.bless import LockRequest, bless
    from envguard.render.sanitize import clean

    _utf8_values(args)
    request = LockRequest(
        name=args.name, lock_path=args.lock, from_snapshot=args.from_snapshot,
        python=args.python if args.from_snapshot else select_environment(args.python).python,
        entry_id=args.entry, distribution=args.distribution,
        extras=tuple(args.extras) if args.extras is not None else None,
        file_patterns=tuple(args.files) if args.files is not None else None,
        cache_policy=args.cache_policy,
        forbidden=tuple(args.forbid) if args.forbid is not None else None)
    done = bless(request)
    lock, entry = done.lock, done.entry
    from envguard.redact import redact_text

    shown = clean(redact_text(str(done.path)), 4000)
    write_stdout(f"{shown}: {'replaced' if done.replaced else 'added'} entry "
                 f"{clean(entry.id)} "
                 f"({len(entry.packages)} packages; {len(lock.entries)} entries in all; "
                 f"{len(lock.files)} files pinned)\n")
    return ExitCode.OK


def cmd_check(args: argparse.Namespace) -> int:
    if not args.name and not args.lock:
        raise InputError("name a lock (envguard check NAME) or pass --lock PATH")
    name, lock_path = lock_choice(args.name or "", args.lock)
    python = select_environment(args.python, probe=True).python
    from envguard.gate import check_command

    result = check_command(name, lock=lock_path, python=python, strict=args.strict)
    show(result, args.format)
    return ExitCode.OK if result.passed else ExitCode.DRIFT


def _check_runnable(command: str) -> None:
    """The command exists where the child will look for it (its PATH, or the path given)."""
    from envguard.errors import CommandNotFound
    from envguard.gate.runner import resolve_command

    found = resolve_command(command, os.environ)
    if found is not None and not os.path.isdir(found):
        return
    if found is None and os.sep in command and os.path.isfile(command):
        raise CommandNotFound(f"command not executable: {command}")
    raise CommandNotFound(f"command not found: {command}")


def lock_choice(name: str, lock: str | None) -> tuple[str, str | None]:
    """``--lock`` is a path when it has a ``/`` or ends in ``.toml``, else a lock name
    (looked up like a command's): returns (name, path or None)."""
    if lock is None or is_lock_path(lock):
        return name, lock
    return lock, None


def cmd_run(args: argparse.Namespace) -> int:
    argv = list(args.argv)
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        raise InputError("no command: envguard run [options] -- CMD [ARGS...]")
    _check_runnable(argv[0])  # before the gate: a typo is not a drifted environment
    name, lock_path = lock_choice(os.path.basename(argv[0]), args.lock)
    python = select_environment(args.python, command=argv[0], probe=True).python
    from envguard.gate import SNAPSHOT_ENV, VERIFIED_ENV, check_command
    from envguard.gate.runner import run_child
    from envguard.runs.store import now_iso

    result = check_command(name, lock=lock_path, python=python, strict=args.strict)
    say_environment()  # before the refusal, or the child's own output
    lock, path, snapshot = result.lock, result.lock_path, result.snapshot
    entry = result.matched.entry.id if result.matched else None
    meta: dict[str, Any] = {
        "argv": argv, "lock": lock.name, "lockfile": str(path), "entry": entry,
        "passed": result.passed, "forced": args.force and not result.passed,
        "findings": [f.rule for f in result.findings]}
    shown = os.path.basename(argv[0])
    if not result.passed and not args.force:
        _show_on_stderr(result)
        why = ("this machine is new to" if result.new_machine is not None
               else "the environment does not match")
        sys.stderr.write(f"envguard: refused to run {shown}: {why} {path} (use --force to run "
                         "anyway)\n")
        at = now_iso()
        _record(snapshot, meta, started_at=at, ended_at=at, exit_code=None, signal=None)
        return ExitCode.REFUSED
    if not result.passed:
        sys.stderr.write(f"envguard: --force: running {shown} although the environment does "
                         f"not match {path}\n")
    elif result.findings:
        _show_on_stderr(result)
    sys.stderr.flush()
    env = dict(os.environ)
    for stale in (VERIFIED_ENV, SNAPSHOT_ENV):  # an outer envguard run's, not this gate's
        env.pop(stale, None)
    with tempfile.TemporaryDirectory(prefix="envguard-run-") as private:  # 0700
        if result.passed:
            text = snapshot.to_json()
            digest = "sha256:" + hashlib.sha256(text.encode()).hexdigest()  # = snapshot.sha256
            env[VERIFIED_ENV] = f"{lock.name}:{entry}:{digest}"
            env[SNAPSHOT_ENV] = _private_copy(Path(private), text)
        started = now_iso()
        ended = run_child(argv, env)
    # From here on nothing changes the child's status: a record that cannot be written, or
    # a comparison that fails, is one line on stderr.
    record = _record(snapshot, meta, started_at=started, ended_at=now_iso(),
                     exit_code=ended.status, signal=ended.signal_name)
    if record is not None and record.failed:
        _explain_failure(shown, record, snapshot)
    return ended.status


def _show_on_stderr(result: GateResult) -> None:
    """The gate's report as text on stderr (renderers imported only when there is one)."""
    from envguard.render import render

    sys.stderr.write(render(result, OutputFormat.TEXT, screen=StreamScreen(sys.stderr)))


def _private_copy(folder: Path, text: str) -> str:
    """The gate's snapshot in a file only this user reads, for the child (SNAPSHOT_ENV)."""
    path = folder / "snapshot.json"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)
    return str(path)


def _record(snapshot: Snapshot, meta: dict[str, Any], **outcome: Any) -> RunRecord | None:
    from envguard.errors import EnvguardError
    from envguard.runs.store import record_run

    try:
        return record_run(snapshot, cwd=Path.cwd(), **meta, **outcome)
    except (EnvguardError, OSError) as exc:
        note(f"could not record this run: {exc}")
    except Exception as exc:  # noqa: BLE001 - a bug must not change the child's status
        _internal("recording this run", exc)
    return None


def _internal(what: str, exc: Exception) -> None:
    if os.environ.get("ENVGUARD_DEBUG"):
        raise exc
    note(f"internal error while {what}: {type(exc).__name__}: {exc} (set ENVGUARD_DEBUG=1 "
         "for the traceback, and please report it)")


def _explain_failure(shown: str, record: RunRecord, snapshot: Snapshot) -> None:
    """After a failed run: what changed since the last successful one, in a few lines."""
    from envguard.errors import EnvguardError
    from envguard.runs.failure import explain_failure

    how = f"{shown} {'was ' if record.signal else ''}{record.outcome.replace('exit ', 'exited ')}"
    try:
        found = explain_failure(Path.cwd(), snapshot)
    except (EnvguardError, OSError) as exc:
        note(f"{how}; could not compare with the last successful run: {exc}")
        return
    except Exception as exc:  # noqa: BLE001 - a bug must not change the child's status
        _internal("comparing with the last successful run", exc)
        return
    good = found.last_good
    if good is None:
        note(f"{how}; no successful guarded run recorded here yet to compare with")
    elif found.problem is not None:
        note(f"{how}; could not compare with the last successful run: {found.problem}")
    elif found.identical:
        note(f"{how}; environment identical to the last successful run at {good.ended_at}: "
             "look at your code or data")
    else:
        note(f"{how}; changed since the last successful run at {good.ended_at}:")
        for line in found.lines:
            note(f"  {line}")
        more = f" ({found.more} more)" if found.more else ""
        note(f"full report{more}: envguard diff @last-good @run:1")
