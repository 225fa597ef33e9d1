"""``envguard diff``: explain what changed between two snapshots.

Either side may be a file, ``-`` (stdin), or an alias: ``@last-good``,
``@last-good:LOCK``, ``@latest``, ``@run:N`` (:mod:`envguard.runs.refs`) or ``@now`` (a
fresh snapshot, taken the way the other side's run took its own when the other side is a
run); :func:`envguard.cli.options.load_pair` reads them. Defaults: ``@last-good`` and
``@now``.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from envguard.cli.options import NOW, REF_HELP, add_format_option, load_pair
from envguard.cli.output import show
from envguard.exitcodes import ExitCode

if TYPE_CHECKING:
    from envguard.explain.interface import Finding
    from envguard.model import Snapshot


def add_parsers(sub: argparse._SubParsersAction[Any]) -> None:
    dif = sub.add_parser(
        "diff", help="explain what changed between two snapshots",
        description="Compare two snapshots and explain the likely causes of a regression, "
        "most likely first, with evidence and a remedy. A snapshot is " + REF_HELP + ".",
        epilog="exit status: 0 equivalent, 1 different, 2 bad input or usage "
        "(envguard help cli)")
    dif.add_argument("old", metavar="GOOD", nargs="?", default="@last-good",
                     help="the snapshot of the state that worked (default: @last-good)")
    dif.add_argument("new", metavar="NOW", nargs="?", default=NOW,
                     help="the snapshot of the state that fails (default: @now)")
    add_format_option(dif, help="text (default, for a terminal), json (stable schema) or markdown")
    dif.add_argument("--symptom", metavar="TEXT",
                     help="a pasted error line; findings it points at come first")
    dif.add_argument("--all", action="store_true", help="list every change, also immaterial")
    dif.add_argument("--python", metavar="PY",
                     help="the environment @now snapshots (default: the discovery rule; for a "
                     "run's snapshot on the other side, that run's interpreter)")
    dif.set_defaults(handler=cmd_diff)


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


def cmd_diff(args: argparse.Namespace) -> int:
    from envguard.changes import diff
    from envguard.explain import explain, symptom_text
    from envguard.explain.report import DiffReport
    from envguard.redact import redact_text

    old, new = load_pair(args.old, args.new, python=args.python)
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
