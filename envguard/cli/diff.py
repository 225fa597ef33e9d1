"""``envguard diff``: explain what changed between two snapshots.

Either side may be a file, ``-`` (stdin), or an alias: ``@last-good``, ``@latest``,
``@run:N`` (:mod:`envguard.runs.refs`) or ``@now`` (a fresh snapshot, taken the way the
other side's run took its own when the other side is a run). Defaults: ``@last-good`` and
``@now``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from envguard.cli.options import add_format_option
from envguard.cli.output import show
from envguard.errors import InputError
from envguard.exitcodes import ExitCode
from envguard.frozen import frozen

if TYPE_CHECKING:
    from envguard.explain.interface import Finding
    from envguard.model import Snapshot
    from envguard.runs.store import RunRecord

NOW = "@now"


def add_parsers(sub: argparse._SubParsersAction[Any]) -> None:
    dif = sub.add_parser(
        "diff", help="explain what changed between two snapshots",
        description="Compare two snapshots and explain the likely causes of a regression, "
        "most likely first, with evidence and a remedy. A snapshot is a file, - (stdin), "
        "or @last-good, @latest, @run:N (the Nth newest guarded run) or @now (a fresh one).",
        epilog="exit status: 0 equivalent, 1 different, 2 bad input or usage "
        "(see docs/CLI.md)")
    dif.add_argument("old", metavar="GOOD", nargs="?", default="@last-good",
                     help="the snapshot of the state that worked (default: @last-good)")
    dif.add_argument("new", metavar="NOW", nargs="?", default=NOW,
                     help="the snapshot of the state that fails (default: @now)")
    add_format_option(dif, help="text (default, for a terminal), json (stable schema) or markdown")
    dif.add_argument("--symptom", metavar="TEXT",
                     help="a pasted error line; findings it points at come first")
    dif.add_argument("--all", action="store_true", help="list every change, also immaterial")
    dif.set_defaults(handler=cmd_diff)


@frozen
class Side:
    snapshot: Snapshot
    label: str
    run: RunRecord | None = None


def _read_stdin() -> Snapshot:
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


def _load(ref: str) -> Side:
    from envguard.runs.refs import is_alias, resolve
    from envguard.snapshot_file import read_snapshot

    if ref == "-":
        return Side(snapshot=_read_stdin(), label="stdin")
    if is_alias(ref):
        found = resolve(ref, Path.cwd())
        return Side(snapshot=read_snapshot(found.path, follow=False), label=found.label,
                    run=found.run)
    return Side(snapshot=read_snapshot(ref), label=ref)


def _now(other: Side | None) -> Side:
    """A fresh snapshot; like the other side's run took its own, when it is a run."""
    from envguard.cli.options import select_environment
    from envguard.cli.output import StderrProgress
    from envguard.probe import SnapshotOptions, collect
    from envguard.runs.refs import gate_options_for

    options = None
    if other is not None and other.run is not None:
        options = gate_options_for(other.run, other.snapshot)
    if options is None:
        selection = select_environment(None)
        options = SnapshotOptions(python=selection.python, selected_by=selection.selected_by)
    with StderrProgress() as progress:
        snapshot = collect(options, progress)
    return Side(snapshot=snapshot, label="@now (this environment)")


def _with_install_times(findings: list[Finding], snapshot: Snapshot) -> list[Finding]:
    """Each finding about packages gains when the disk says they were (re)installed."""
    import dataclasses
    import time

    from envguard.history import install_evidence
    from envguard.history.collect import read_timeline

    timeline = read_timeline(snapshot, cwd=Path.cwd())
    out = []
    for f in findings:
        names = sorted({"torch" if c.section == "torch" else c.key.split(" ")[0]
                        for c in f.changes if c.section in ("torch", "packages", "integrity")})
        extra = install_evidence(timeline, names[:3], time.time())
        out.append(dataclasses.replace(f, evidence=(*f.evidence, *extra)) if extra else f)
    return out


def load_pair(old_ref: str, new_ref: str) -> tuple[Side, Side]:
    """Both sides of a comparison: files, ``-`` (stdin, one side), run aliases or ``@now``."""
    if old_ref == "-" and new_ref == "-":
        raise InputError("only one side can be read from stdin (-)")
    old = None if old_ref == NOW else _load(old_ref)
    new = None if new_ref == NOW else _load(new_ref)
    if old is None:
        old = _now(new)
    if new is None:
        new = _now(old)
    return old, new


def cmd_diff(args: argparse.Namespace) -> int:
    from envguard.changes import diff
    from envguard.explain import explain, symptom_text
    from envguard.explain.report import DiffReport
    from envguard.redact import redact_text

    old, new = load_pair(args.old, args.new)
    # a failed guarded run is its own symptom: the last lines it wrote to stderr
    tail = "\n".join(new.run.stderr_tail) if new.run is not None and new.run.failed else ""
    symptom = symptom_text(args.symptom or tail or None)
    changes = diff(old.snapshot, new.snapshot)
    findings = explain(old.snapshot, new.snapshot, changes, symptom)
    if args.new == NOW:  # this machine, now: its disk says when things were installed
        findings = _with_install_times(findings, new.snapshot)
    report = DiffReport(old_name=redact_text(old.label), new_name=redact_text(new.label),
                        diff=changes, findings=tuple(findings), symptom=symptom)
    show(report, args.format, show_all=args.all)
    return ExitCode.OK if report.equivalent else ExitCode.DRIFT
