"""The program: the parser assembled from the command modules, the one mapping from errors
to exit statuses, signals, and the fast exit.

Each command is the module of its name in :mod:`envguard.cli` (``COMMANDS``), with an
``add_parsers`` that adds it to the parser and sets its handler; only the module of the
command being run is imported (the gate in front of every launch imports no other).
A handler returns an :class:`~envguard.exitcodes.ExitCode` or raises an
:class:`~envguard.errors.EnvguardError`; :func:`run_command` turns either into the exit
status, here only.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import re
import signal
import sys
from collections.abc import Callable, Iterator
from typing import NoReturn

from envguard.cli.output import drop_environment_line, note, say_environment
from envguard.errors import EnvguardError
from envguard.exitcodes import ExitCode

COMMANDS = ("snapshot", "diff", "doctor", "history", "lock", "check", "run", "restore",
            "bisect", "cache", "fleet", "runs", "install", "revisions", "undo", "shell-hook",
            "completion", "help")
"""The commands, in the order ``--help`` lists them; each one is defined by the module
``envguard.cli.<command>`` (a ``-`` in the name is a ``_`` in the module's)."""


class Parser(argparse.ArgumentParser):
    """argparse, but usage errors are one line and exit with ExitCode.USAGE."""

    def error(self, message: str) -> NoReturn:
        from envguard.redact import redact_usage
        from envguard.render.sanitize import clean

        line = clean(redact_usage(message, sys.argv[1:]))  # it may quote --token=X
        hint = did_you_mean(message, self)
        sys.stderr.write(f"{self.prog}: error: {line}{hint} (see {self.prog} --help)\n")
        raise SystemExit(ExitCode.USAGE)


_INVALID_CHOICE = re.compile(r"invalid choice: '([^']*)' \(choose from (.*)\)")
_UNRECOGNIZED = re.compile(r"unrecognized arguments: (-[^\s=]+)")


def did_you_mean(message: str, parser: argparse.ArgumentParser) -> str:
    """``; did you mean 'snapshot'?`` for a mistyped command, choice or option, as git and uv
    say it; empty when nothing is close (or the word looks like a secret's place)."""
    import difflib

    choice = _INVALID_CHOICE.search(message)
    if choice:
        word = choice.group(1)
        known = re.findall(r"'([^']*)'|([^\s,']+)", choice.group(2))
        candidates = [a or b for a, b in known]
    else:
        option = _UNRECOGNIZED.search(message)
        if option is None:
            return ""
        word = option.group(1)
        candidates = _options_of(parser)
    close = difflib.get_close_matches(word, candidates, n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close and close[0] != word else ""


def _options_of(parser: argparse.ArgumentParser) -> list[str]:
    """The option strings of the command the words name (the root's and its own)."""
    words = [w for w in sys.argv[1:] if not w.startswith("-")]
    options = [o for a in parser._actions for o in a.option_strings]
    current = parser
    for word in words:
        subs = [a for a in current._actions if isinstance(a, argparse._SubParsersAction)]
        child = subs[0].choices.get(word) if subs else None
        if child is None:
            break
        current = child
        options += [o for a in child._actions for o in a.option_strings]
    return options


def _commands_for(argv: list[str] | None) -> tuple[str, ...]:
    """The commands the parser needs: only the one named in ``argv`` (the gate in front of
    every launch should not import the others), all of them for ``--help``, ``-V``, no
    command or an unknown one (argparse lists them), and for ``completion``."""
    words = sys.argv[1:] if argv is None else argv
    first = next((w for w in words if not w.startswith("-")), None)
    return (first,) if first in COMMANDS and "completion" not in words else COMMANDS


def build_parser(argv: list[str] | None = None, *, every_command: bool = True
                 ) -> argparse.ArgumentParser:
    """The parser. ``every_command=False``: only the command ``argv`` names (see
    :func:`_commands_for`)."""
    from envguard.version import __version__

    parser = Parser(
        prog="envguard",
        description="Record the environment a training run worked in; explain what changed.",
        epilog="The manual: envguard help (its topics), envguard help COMMAND.",
    )
    parser.add_argument("-V", "--version", action="version", version=f"envguard {__version__}",
                        help="print envguard's version and exit")
    parser.set_defaults(root_parser=parser)  # for envguard completion
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    sub.required = True
    for name in COMMANDS if every_command else _commands_for(argv):
        importlib.import_module(f"envguard.cli.{name.replace('-', '_')}").add_parsers(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run envguard; returns the exit status."""
    return run_command(build_parser(argv, every_command=False), argv)


def _fail(message: str, code: ExitCode) -> int:
    from envguard.redact import redact_text
    from envguard.render.sanitize import clean

    drop_environment_line()
    sys.stderr.write(f"envguard: error: {clean(redact_text(message), 1000)}\n")
    return int(code)


def run_command(parser: argparse.ArgumentParser, argv: list[str] | None) -> int:
    """Parse ``argv`` and run its handler; every error becomes its exit status, here only."""
    drop_environment_line()
    try:
        args = parser.parse_args(argv)
        handler: Callable[[argparse.Namespace], int] = args.handler
        code = int(handler(args))
        if code in (ExitCode.OK, ExitCode.DRIFT):
            say_environment()
        return code
    except SystemExit as exc:  # argparse --help/--version/usage errors
        return int(exc.code) if isinstance(exc.code, int) else int(ExitCode.USAGE)
    except EnvguardError as exc:
        return _fail(str(exc), exc.exit_code)
    except KeyboardInterrupt:
        _stop_processes()
        sys.stderr.write("envguard: interrupted\n")
        return int(ExitCode.INTERRUPTED)
    except Exception as exc:
        if os.environ.get("ENVGUARD_DEBUG"):
            raise
        return _fail(f"internal error: {type(exc).__name__}: {exc} (set ENVGUARD_DEBUG=1 for "
                     "the traceback, and please report it)", ExitCode.INTERNAL_ERROR)


def _stop_processes() -> None:
    """Whatever envguard started and still runs dies with the interruption: the commands
    kill their own processes, and this catches one started in the instant before."""
    build = sys.modules.get("envguard.restore.build")
    if build is not None:
        build.kill_running()


@contextlib.contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """SIGTERM (a scheduler's time limit, ``kill``) and SIGHUP (the terminal went away) act
    like Ctrl-C while uv builds or a command runs, so partial venvs are removed instead of left
    behind."""

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, interrupt) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def finish(code: int) -> None:
    """What ends the console script once :func:`main` returned ``code``:
    :func:`say_distrusted`, then :func:`end_now`."""
    say_distrusted()
    end_now(code)


def say_distrusted() -> None:
    """Under ``ENVGUARD_DEBUG``: each folder envguard did not trust with its bytecode or
    memo files, and why (:func:`envguard.paths.private_folder`); otherwise that costs only
    time, silently."""
    paths = sys.modules.get("envguard.paths")
    if paths is not None and paths.DISTRUSTED and os.environ.get("ENVGUARD_DEBUG"):
        for line in dict.fromkeys(paths.DISTRUSTED):
            note(line)


def end_now(code: int) -> None:
    """End the process with ``code`` without the interpreter's teardown, which frees every
    object one by one (about 10 ms after a snapshot on a 2-core VM), once what an exit
    does that matters is done: the ``atexit`` handlers (forked workers and probes ended,
    coverage and the like saved) and stdout and stderr flushed. Returns instead, for an
    ordinary exit, while another non-daemon thread runs (a normal exit would wait for it),
    if a flush fails, or on an interpreter without ``atexit._run_exitfuncs``."""
    import atexit
    import threading

    run_exitfuncs = getattr(atexit, "_run_exitfuncs", None)
    main_thread = threading.main_thread()
    if run_exitfuncs is None or any(t is not main_thread and not t.daemon
                                    for t in threading.enumerate()):
        return
    run_exitfuncs()
    try:
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:  # None: the descriptor was closed at the start
                stream.flush()
    except (OSError, ValueError):
        return  # the ordinary exit reports it (a closed pipe, a full disk)
    os._exit(code)
