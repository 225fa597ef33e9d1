"""``envguard history``: what happened to this environment, read from the disk.

Part of the CLI layer (it prints); the timeline is :mod:`envguard.history`'s, the text
:mod:`envguard.render.history`'s.
"""

from __future__ import annotations

import argparse
import re
import time
from pathlib import Path
from typing import Any

from envguard.cli.options import add_examine_options, examined_snapshot
from envguard.cli.output import show
from envguard.exitcodes import ExitCode

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|min|h|d|w)?\s*$")
_UNIT_S = {"s": 1, "m": 60, "min": 60, "h": 3600, "d": 86400, "w": 604800, None: 86400}


def add_parsers(sub: argparse._SubParsersAction[Any]) -> None:
    hist = sub.add_parser(
        "history", help="what happened to this environment, read from the disk",
        description="A timeline without any earlier snapshot: packages installed or "
                    "reinstalled (dist-info times), files modified after install, compile "
                    "caches created or written, conda's history, envguard's recorded runs; "
                    "events close in time grouped into one episode, a recorded run an "
                    "episode of its own; each install named upgraded, downgraded, ... from "
                    "the snapshots of the runs around it.")
    add_examine_options(hist)
    hist.add_argument("--since", metavar="DURATION", type=_duration,
                      help="only events newer than this: 90m, 6h, 3d, 2w (a bare number is "
                           "days)")
    hist.set_defaults(handler=cmd_history)


def _duration(text: str) -> float:
    found = _DURATION.match(text)
    if not found:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration (90m, 6h, 3d, 2w)")
    return float(found.group(1)) * _UNIT_S[found.group(2)]


def cmd_history(args: argparse.Namespace) -> int:
    from envguard.history.collect import read_timeline

    snapshot, _ = examined_snapshot(args, "size")
    timeline = read_timeline(snapshot, cwd=Path.cwd())
    if args.since is not None:
        timeline = timeline.since(time.time() - args.since)
    show(timeline, args.format)
    return ExitCode.OK
