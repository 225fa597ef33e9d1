"""The options several commands share, and what they select: which environment a command
looks at (``--python``, said on stderr), what a snapshot probes, ``--format``, ``--lock``,
uv's index options.

An option of one command alone is defined in that command's module; one that a second
command takes too comes here, as an ``add_*`` function (the flags) beside the function that
reads them back from the parsed arguments.
"""

from __future__ import annotations

import argparse
import os
from typing import TYPE_CHECKING, Any

from envguard.cli.output import StderrProgress, hold_environment_line
from envguard.errors import InputError
from envguard.frozen import frozen

if TYPE_CHECKING:
    from envguard.model import Snapshot
    from envguard.probe import SnapshotOptions
    from envguard.probe.discovery import Selection
    from envguard.restore.plan import IndexOptions
    from envguard.runs.store import RunRecord

# ------------------------------------------------------------------ the environment

def select_environment(python: str | None, *, quiet: bool = False,
                       command: str | None = None, probe: bool = False,
                       verify: str = "size") -> Selection:
    """The environment a command looks at (:func:`envguard.probe.discovery.discover`), said
    on stderr in one line unless ``quiet``: ``envguard: environment: ~/t/.venv (VIRTUAL_ENV)``.
    With ``command`` (``envguard run``) and no ``python``: the interpreter that command runs
    under, when it is Python (``python`` on PATH, a console script's shebang). ``probe``:
    the command will snapshot it (under ``--verify verify``), so what that needs first
    starts now, while the command imports the rest (:func:`envguard.probe.prefetch`)."""
    from pathlib import Path

    from envguard.probe.discovery import Selection, discover, prefix_of

    selection: Selection | None = None
    if command is not None and not python:
        from envguard.gate.launch import command_interpreter

        found = command_interpreter(command, os.environ)
        if found is not None:
            selection = Selection(executable=found[0], prefix=prefix_of(found[0]),
                                  selected_by=found[1])
    if selection is None:
        selection = discover(python, env=os.environ, cwd=Path.cwd())
    hold_environment_line(None if quiet else f"environment: {selection.describe()}")
    if probe:
        from envguard.probe import prefetch

        prefetch(selection.python, selection.prefix, verify)
    return selection


def add_examine_options(parser: argparse.ArgumentParser) -> None:
    """``--python``, ``--format`` and ``-q`` of the commands that examine one environment
    alone (``doctor``, ``history``)."""
    parser.add_argument("--python", metavar="PY",
                        help="the environment to examine (default: ENVGUARD_PYTHON, "
                             "VIRTUAL_ENV, CONDA_PREFIX, .venv, python3 on PATH)")
    add_format_option(parser, help="text (default), json or markdown")
    parser.add_argument("-q", "--quiet", action="store_true",
                        help="no environment line and no progress notes on stderr")


def examined_snapshot(args: argparse.Namespace, verify: str) -> tuple[Any, str]:
    """The snapshot the doctor takes of the environment :func:`add_examine_options` chose
    (checked under ``--verify verify``), and that environment in words."""
    from envguard.doctor.facts import snapshot_options
    from envguard.probe import collect

    selection = select_environment(args.python, quiet=args.quiet)
    options = snapshot_options(selection, verify=verify)
    with StderrProgress(quiet=args.quiet) as progress:
        return collect(options, progress), selection.describe()


# ------------------------------------------------------------------ snapshots

def add_probe_options(parser: argparse.ArgumentParser) -> None:
    """The flags that say what a snapshot probes (``snapshot`` and ``fleet snapshot``)."""
    parser.add_argument("--python", metavar="PY",
                        help="snapshot another interpreter or venv folder (stdlib-only probe; "
                        "default: ENVGUARD_PYTHON, VIRTUAL_ENV, CONDA_PREFIX, .venv, "
                        "python3 on PATH)")
    parser.add_argument("--file", dest="files", action="append", default=[], metavar="GLOB",
                        help="record size, md5 and sha256 of matching files (repeatable)")
    parser.add_argument("--verify", choices=("size", "hash", "none"), default="size",
                        help="check installed files against RECORD by size (default) or hash")
    parser.add_argument("--deep", action="store_true",
                        help="also import torch in a crash-isolated subprocess")
    # Accepted, hidden, for the scripts that pass it: it never did anything (snapshots
    # never write into compile caches; docs/CLI.md).
    parser.add_argument("--no-cache-marker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--no-project-config", action="store_true",
                        help="ignore [tool.envguard] in the nearest pyproject.toml")


def probe_options(args: argparse.Namespace, selection: Selection) -> SnapshotOptions:
    """SnapshotOptions from the flags of :func:`add_probe_options`, for ``selection``."""
    from envguard.probe import SnapshotOptions

    return SnapshotOptions(
        python=selection.python,
        selected_by=selection.selected_by,
        verify=args.verify,
        deep=args.deep,
        file_patterns=tuple(args.files),
        use_project_config=not args.no_project_config,
    )


# ------------------------------------------------------------------ snapshot references

NOW = "@now"
REF_HELP = ("a snapshot file, - (stdin), @last-good, @last-good:LOCK, @latest, @run:N (the Nth "
            "newest guarded run) or @now (a fresh one)")


@frozen
class Side:
    """A snapshot a command was given, and how its report names it."""

    snapshot: Snapshot
    label: str
    run: RunRecord | None = None


def _read_stdin() -> Snapshot:
    import sys

    from envguard.model import Snapshot
    from envguard.snapshot_file import MAX_SNAPSHOT_BYTES, naming, remask

    data = sys.stdin.buffer.read(MAX_SNAPSHOT_BYTES + 1)
    if len(data) > MAX_SNAPSHOT_BYTES:
        raise InputError(f"-: the snapshot on stdin is larger than {MAX_SNAPSHOT_BYTES} bytes")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise InputError("-: the snapshot on stdin is not UTF-8") from None
    with naming("-"):
        return remask(Snapshot.from_json(text))


def recorded_path(ref: str) -> tuple[str, str]:
    """A file, or the file a recorded alias names (not ``@now`` or ``-``): (path, label)."""
    from pathlib import Path

    from envguard.runs.refs import is_alias, resolve

    if not is_alias(ref):
        return ref, ref
    found = resolve(ref, Path.cwd())
    return str(found.path), found.label


def load_side(ref: str, *, other: Side | None = None, python: str | None = None) -> Side:
    """What a snapshot argument names: a file, ``-``, a recorded alias, or ``@now`` (a fresh
    snapshot of the environment ``python`` or the discovery rule chooses, said on stderr;
    like the other side's run took its own when ``other`` is a run)."""
    from pathlib import Path

    from envguard.runs.refs import is_alias, resolve
    from envguard.snapshot_file import read_snapshot

    if ref == NOW:
        return _now(other, python)
    if ref == "-":
        return Side(snapshot=_read_stdin(), label="stdin")
    if is_alias(ref):
        found = resolve(ref, Path.cwd())
        return Side(snapshot=read_snapshot(found.path, follow=False), label=found.label,
                    run=found.run)
    return Side(snapshot=read_snapshot(ref), label=ref)


def _now(other: Side | None, python: str | None) -> Side:
    from envguard.probe import SnapshotOptions, collect
    from envguard.probe.discovery import shorten_home
    from envguard.runs.refs import gate_options_for

    options = None
    if other is not None and other.run is not None and python is None:
        options = gate_options_for(other.run, other.snapshot)
    if options is not None:
        where = f"the interpreter of run {other.run.id}" if other and other.run else "its run"
        exe = options.python or ""
        hold_environment_line(f"environment: {exe} ({where})")
    else:
        selection = select_environment(python)
        options = SnapshotOptions(python=selection.python, selected_by=selection.selected_by)
    with StderrProgress() as progress:
        snapshot = collect(options, progress)
    where = shorten_home(snapshot.interpreter.prefix or snapshot.interpreter.executable or "?")
    return Side(snapshot=snapshot, label=f"@now ({where})")


def load_pair(old_ref: str, new_ref: str, *, python: str | None = None) -> tuple[Side, Side]:
    """Both sides of a comparison (:func:`load_side`); one side at most from stdin."""
    if old_ref == "-" and new_ref == "-":
        raise InputError("only one side can be read from stdin (-)")
    old = None if old_ref == NOW else load_side(old_ref)
    new = None if new_ref == NOW else load_side(new_ref)
    if old is None:
        old = load_side(NOW, other=new, python=python)
    if new is None:
        new = load_side(NOW, other=old, python=python)
    return old, new


# ------------------------------------------------------------------ reports, locks, uv

def add_format_option(p: argparse.ArgumentParser, *, help: str) -> None:
    """``--format``: every report's text (the default), JSON and Markdown."""
    from envguard.render.formats import OutputFormat
    p.add_argument("--format", choices=[f.value for f in OutputFormat], default="text", help=help)


LOCK_HELP = ("the lockfile, or a lock's name (default: lockfiles/NAME.toml here or in a "
             "parent folder, NAME the command's basename, else the one bundled with envguard)")


def add_lock_option(p: argparse.ArgumentParser) -> None:
    """``--lock`` of ``check`` and ``run``: a path or a lock's name (:func:`lock_choice`)."""
    p.add_argument("--lock", metavar="PATH", help=LOCK_HELP)


def lock_choice(name: str, lock: str | None) -> tuple[str, str | None]:
    """``--lock`` is a path when it has a ``/`` or ends in ``.toml``, else a lock name
    (looked up like a command's): returns (name, path or None)."""
    # The tables, not envguard.gate.lockfile: building the parser must import nothing heavy
    # (the lockfile needs packaging.markers: 20-60 ms on every command otherwise).
    from envguard.explain.tables import is_lock_path

    if lock is None or is_lock_path(lock):
        return name, lock
    return lock, None


def add_index_options(p: argparse.ArgumentParser, *, find_links_help: str) -> None:
    """uv's index options, as ``restore`` and ``bisect`` take them."""
    p.add_argument("--index-url", metavar="URL", help="passed to uv")
    p.add_argument("--extra-index-url", action="append", default=[], metavar="URL",
                   help="passed to uv (repeatable)")
    p.add_argument("--find-links", action="append", default=[], metavar="PATH",
                   help=find_links_help)
    p.add_argument("--no-index", action="store_true", help="passed to uv: only --find-links")
    p.add_argument("--offline", action="store_true",
                   help="uv's offline mode: no network, only uv's cache and --find-links")


def index_options(args: argparse.Namespace) -> IndexOptions:
    """The options of :func:`add_index_options`, ``--find-links`` folders made absolute."""
    from envguard.restore.plan import IndexOptions, link_paths

    return IndexOptions(index_url=args.index_url, extra_index_urls=tuple(args.extra_index_url),
                        find_links=link_paths(args.find_links), no_index=args.no_index,
                        offline=args.offline)
