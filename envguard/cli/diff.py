"""``envguard diff``: explain what changed between two snapshots."""

from __future__ import annotations

import argparse
from typing import Any

from envguard.cli._common import show
from envguard.exitcodes import ExitCode
from envguard.render.formats import OutputFormat


def add_parsers(sub: argparse._SubParsersAction[Any]) -> None:
    dif = sub.add_parser(
        "diff", help="explain what changed between two snapshots",
        description="Compare two snapshots and explain the likely causes of a regression, "
        "most likely first, with evidence and a remedy.",
        epilog="exit status: 0 equivalent, 1 different, 2 bad input or usage "
        "(see docs/CLI.md)")
    dif.add_argument("old", metavar="GOOD.json", help="the snapshot of the state that worked")
    dif.add_argument("new", metavar="NOW.json", help="the snapshot of the state that fails")
    dif.add_argument("--format", choices=[f.value for f in OutputFormat], default="text",
                     help="text (default, for a terminal), json (stable schema) or markdown")
    dif.add_argument("--symptom", metavar="TEXT",
                     help="a pasted error line; findings it points at come first")
    dif.add_argument("--all", action="store_true", help="list every change, also immaterial")
    dif.set_defaults(handler=cmd_diff)


def cmd_diff(args: argparse.Namespace) -> int:
    from envguard.diff import diff
    from envguard.explain import explain
    from envguard.render.report import DiffReport
    from envguard.snapshot_file import read_snapshot

    old, new = read_snapshot(args.old), read_snapshot(args.new)
    changes = diff(old, new)
    report = DiffReport(old_name=args.old, new_name=args.new, diff=changes,
                        findings=tuple(explain(old, new, changes, args.symptom)),
                        symptom=args.symptom)
    show(report, args.format, show_all=args.all)
    return ExitCode.OK if report.equivalent else ExitCode.DRIFT
