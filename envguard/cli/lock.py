"""``envguard lock``: bless an environment as known-good for a command.

Part of the CLI layer (it prints); the lockfile is written by :mod:`envguard.gate.bless`.
"""

from __future__ import annotations

import argparse
from typing import Any

from envguard.cli.options import select_environment
from envguard.cli.output import write_stdout
from envguard.errors import InputError
from envguard.exitcodes import ExitCode

# The tables, not envguard.gate.lockfile: building the parser must import nothing heavy
# (the lockfile needs packaging.markers: 20-60 ms on every command otherwise).
from envguard.explain.tables import CACHE_POLICIES


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
    lock.add_argument("--distribution", dest="distributions", action="append", default=None,
                      metavar="DIST",
                      help="pin DIST and what it requires (repeatable; default: the "
                      "distribution of the command's entry point, else the project of "
                      "pyproject.toml, else every installed distribution)")
    lock.add_argument("-r", "--requirement", dest="requirements", action="append",
                      default=None, metavar="FILE",
                      help="pin the distributions a requirements file names and what they "
                      "require (repeatable; names only: versions, options and markers that "
                      "do not apply are left out)")
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


def _utf8_values(args: argparse.Namespace) -> None:
    """The lock's words go into a UTF-8 TOML file: a name, pattern or extra that is not
    UTF-8 (bytes on the command line that Python keeps as surrogate escapes) is refused
    here with one line, exit 2, instead of failing when the lock is written."""
    for option, value in (("NAME", args.name), ("--entry", args.entry),
                          *(("--distribution", v) for v in args.distributions or ()),
                          *(("-r", v) for v in args.requirements or ()),
                          *(("--file", v) for v in args.files or ()),
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
        entry_id=args.entry, distributions=tuple(args.distributions or ()),
        requirement_files=tuple(args.requirements or ()),
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
