"""``envguard run``: run a command only if the environment matches its lock.

Part of the CLI layer (it prints and picks the exit status): the gate is
:func:`envguard.gate.check_command`; what the child is handed, how it runs and the record
of the run are :mod:`envguard.gate.launch`'s; what changed after a failed run is
:mod:`envguard.runs.failure`'s. Only this command's module is imported in front of the
launch (tests/envguard/gate/test_gate_import_budget.py).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from envguard.cli.options import add_lock_option, lock_choice, select_environment
from envguard.cli.output import note, say_environment, show_on_stderr
from envguard.errors import InputError
from envguard.exitcodes import ExitCode

if TYPE_CHECKING:
    from envguard.gate.check import GateResult
    from envguard.gate.launch import Launched
    from envguard.model import Snapshot
    from envguard.probe.discovery import Selection
    from envguard.runs.store import RunRecord


def add_parsers(sub: argparse._SubParsersAction[Any]) -> None:
    run = sub.add_parser(
        "run", help="run a command only if the environment matches its lock",
        usage="envguard run [--lock PATH] [--python PY] [--force] [--strict] -- CMD [ARGS...]",
        epilog="exit status: the command's own on a match; 3 when refused; 2 bad input")
    add_lock_option(run)
    run.add_argument("--python", metavar="PY",
                     help="the environment CMD runs in (default: the Python CMD runs "
                     "under: its shebang, or python on PATH; else as for check)")
    run.add_argument("--force", action="store_true", help="run even if it does not match")
    run.add_argument("--strict", action="store_true",
                     help="every distribution must match, not only the command's closure")
    run.add_argument("argv", nargs=argparse.REMAINDER, metavar="CMD",
                     help="the command and its arguments, after --, passed on unchanged")
    run.set_defaults(handler=cmd_run)


def cmd_run(args: argparse.Namespace) -> int:
    argv = list(args.argv)
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        raise InputError("no command: envguard run [options] -- CMD [ARGS...]")
    from envguard.gate.launch import require_command

    require_command(argv[0], os.environ)  # before the gate: a typo is not a drifted environment
    name, lock_path = lock_choice(os.path.basename(argv[0]), args.lock)
    selection = select_environment(args.python, command=argv[0], probe=True)
    from envguard.gate import check_command
    from envguard.gate.launch import launch, run_metadata

    result = check_command(name, lock=lock_path, python=selection.python, strict=args.strict,
                           relock_python=_relock_python(args.python, selection))
    say_environment()  # before the refusal, or the child's own output
    meta = run_metadata(argv, result, force=args.force)
    shown = os.path.basename(argv[0])
    if not result.passed and not args.force:
        why = ("this machine is new to" if result.new_machine is not None
               else "the environment does not match")
        sys.stderr.write(f"envguard: refused to run {shown}: {why} {result.lock_path} (use "
                         "--force to run anyway)\n")
        show_on_stderr(result)  # its last line: the command to run next
        _record(result, meta, None)
        return ExitCode.REFUSED
    if not result.passed:
        sys.stderr.write(f"envguard: --force: running {shown} although the environment does "
                         f"not match {result.lock_path}\n")
    elif result.findings:
        show_on_stderr(result)
    sys.stderr.flush()
    launched = launch(argv, result, os.environ)
    # From here on nothing changes the child's status: a record that cannot be written, or
    # a comparison that fails, is one line on stderr.
    record = _record(result, meta, launched)
    if record is not None and record.failed:
        _explain_failure(shown, record, result.snapshot)
    return launched.exit.status


def _relock_python(given: str | None, selection: Selection) -> str | None:
    """The ``--python`` a refusal's ``envguard lock`` needs: the one given, or the command's
    interpreter when ``envguard lock`` would not find that environment by itself."""
    if given or selection.python is None:
        return given
    from envguard.probe.discovery import discover

    found = discover(None, env=os.environ, cwd=Path.cwd())
    return None if found.prefix == selection.prefix else selection.executable


def _record(result: GateResult, meta: dict[str, Any],
            launched: Launched | None) -> RunRecord | None:
    from envguard.errors import EnvguardError
    from envguard.gate.launch import record

    try:
        return record(result, meta, launched, cwd=Path.cwd())
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
    import shlex

    from envguard.errors import EnvguardError
    from envguard.runs.failure import explain_failure

    how = f"{shown} {'was ' if record.signal else ''}{record.outcome.replace('exit ', 'exited ')}"
    try:
        found = explain_failure(Path.cwd(), snapshot, "\n".join(record.stderr_tail),
                                lock=record.lock)
    except (EnvguardError, OSError) as exc:
        note(f"{how}; could not compare with the last successful run: {exc}")
        return
    except Exception as exc:  # noqa: BLE001 - a bug must not change the child's status
        _internal("comparing with the last successful run", exc)
        return
    good = found.last_good
    if good is None:
        of = f" of lock {record.lock}" if record.lock else ""
        note(f"{how}; no successful guarded run{of} recorded here yet to compare with")
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
        good_ref = f"@last-good:{record.lock}" if record.lock else "@last-good"
        note(f"full report{more}: {shlex.join(['envguard', 'diff', good_ref, '@run:1'])}")
