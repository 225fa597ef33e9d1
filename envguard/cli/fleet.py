"""``envguard fleet snapshot`` and ``fleet diff``: which node or rank differs?

Part of the CLI layer (it prints and picks exit codes); grouping and explanation live in
:mod:`envguard.fleet.analyse`, the gathering in :mod:`envguard.fleet.gather`, the text in
:mod:`envguard.render.fleet`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from envguard.cli.options import (
    add_format_option,
    add_probe_options,
    probe_options,
    select_environment,
)
from envguard.cli.output import StderrProgress, note, show
from envguard.errors import InputError
from envguard.exitcodes import ExitCode
from envguard.paths import FLEET_DIR

if TYPE_CHECKING:
    from envguard.fleet.analyse import Member

DEFAULT_DIR_TIMEOUT_S = 120.0
DEFAULT_NET_TIMEOUT_S = 60.0


def add_parsers(sub: argparse._SubParsersAction[Any]) -> None:
    fleet = sub.add_parser(
        "fleet", help="snapshot every rank of a distributed job; find the ranks that differ",
        description="Group many snapshots (one per node or rank) into identical environments "
        "and explain each outlier group against the majority (envguard help fleet).",
        epilog="exit status: 0 all equivalent, 1 some differ, 2 bad input, "
        "4 the ranks could not exchange snapshots (a rank missing, refused or unreadable)")
    actions = fleet.add_subparsers(dest="fleet_command", metavar="ACTION")
    actions.required = True

    snap = actions.add_parser(
        "snapshot", help="snapshot every rank (under torchrun) and report on rank 0",
        description="Every rank records its environment; rank 0 gathers them (over "
        "envguard's own authenticated TCP connection to MASTER_ADDR, or through --dir), "
        "writes one fleet document and prints the fleet diff. Without RANK/WORLD_SIZE: a "
        "fleet of one. The key: $ENVGUARD_FLEET_KEY, else the mask key; the port: "
        "$ENVGUARD_FLEET_PORT, else MASTER_PORT+1 (envguard help fleet).")
    snap.add_argument("-o", "--output", metavar="FLEET.json",
                       help="where rank 0 writes the fleet document (atomically)")
    snap.add_argument("--dir", metavar="DIR",
                      help="exchange snapshots through DIR/rank-<RANK>.json (a folder every "
                      "rank can write) instead of the network")
    snap.add_argument("--timeout", type=float, metavar="S",
                      help=f"how long to wait for the other ranks (default "
                      f"{DEFAULT_DIR_TIMEOUT_S:g} s with --dir, {DEFAULT_NET_TIMEOUT_S:g} s "
                      "over the network)")
    add_probe_options(snap)
    add_format_option(snap, help="rank 0's report: text (default), json (envguard.fleet-diff/1) or "
                                 "markdown")
    snap.add_argument("--ignore-env", action="append", default=[], metavar="NAME",
                      help="another variable that differs per rank by design (repeatable)")
    snap.add_argument("-q", "--quiet", action="store_true",
                      help="rank 0 prints no report and no progress notes (the exit status "
                      "still tells)")
    snap.set_defaults(handler=cmd_fleet_snapshot)

    dif = actions.add_parser(
        "diff", help="group snapshots into identical environments; explain the outliers",
        description="Snapshots (or fleet documents, expanded into their ranks) that are "
        "equivalent form one group; the largest group is the baseline and every other "
        "group is explained against it.",
        epilog="exit status: 0 all equivalent, 1 some differ, 2 bad input or usage")
    dif.add_argument("inputs", nargs="+", metavar="SNAPSHOT.json",
                     help="snapshot files or fleet documents (at least two snapshots in all); "
                     "@last-good, @last-good:LOCK, @latest, @run:N name recorded ones")
    add_format_option(dif, help="text (default), json (envguard.fleet-diff/1) or markdown")
    dif.add_argument("--baseline", metavar="FILE",
                     help="compare with this snapshot instead of the majority (one of the "
                     "inputs, or another file)")
    dif.add_argument("--ignore-env", action="append", default=[], metavar="NAME",
                     help="another variable that differs per rank by design (repeatable)")
    dif.set_defaults(handler=cmd_fleet_diff)


def _unique_names(members: list[Member], paths: dict[int, str]) -> list[Member]:
    """Members named by file name; by the path given when two file names collide."""
    seen: dict[str, int] = {}
    for m in members:
        seen[m.name] = seen.get(m.name, 0) + 1
    return [dataclasses.replace(m, name=paths[i] + m.name[len(Path(paths[i]).name):])
            if seen[m.name] > 1 else m for i, m in enumerate(members)]


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.abspath(a) == os.path.abspath(b)


def cmd_fleet_diff(args: argparse.Namespace) -> int:
    from envguard.fleet.analyse import analyse
    from envguard.fleet.gather import read_members

    members: list[Member] = []
    paths: dict[int, str] = {}
    sources: list[tuple[str, int, int]] = []
    from envguard.cli.options import recorded_path

    for given in args.inputs:
        path, _ = recorded_path(given)
        found = read_members(path)
        sources.append((path, len(members), len(members) + len(found)))
        for m in found:
            paths[len(members)] = path
            members.append(m)
    if len(members) < 2:
        raise InputError("fleet diff needs at least two snapshots (files, or the ranks of a "
                         "fleet document)")
    members = _unique_names(members, paths)
    baseline = None
    if args.baseline:
        args.baseline, _ = recorded_path(args.baseline)
        inside = [(a, b) for p, a, b in sources if _same_file(p, args.baseline)]
        if inside and inside[0][1] - inside[0][0] == 1:
            baseline = members[inside[0][0]]
        elif inside:
            raise InputError(f"{args.baseline}: a fleet document cannot be the baseline; "
                             "pass one snapshot file")
        else:
            found = read_members(args.baseline)
            if len(found) != 1:
                raise InputError(f"{args.baseline}: a fleet document cannot be the baseline; "
                                 "pass one snapshot file")
            baseline = found[0]
    report = analyse(members, baseline=baseline, ignored_variables=args.ignore_env)
    show(report, args.format)
    return ExitCode.OK if report.equivalent else ExitCode.DRIFT


def _default_fleet_path() -> Path:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return FLEET_DIR / f"{stamp}.json"


def cmd_fleet_snapshot(args: argparse.Namespace) -> int:
    from envguard.atomic import write_text_atomic
    from envguard.fleet.analyse import FLEET_SCHEMA, analyse, members_from_document
    from envguard.fleet.gather import entry, gather_dir, launch_from_env
    from envguard.fleet.listen import gather_net
    from envguard.probe import collect

    launch = launch_from_env(os.environ)
    if args.timeout is not None and not 0 < args.timeout <= 1e6:  # also nan and inf
        raise InputError("--timeout must be a positive number of seconds (at most 1e6)")
    # Only rank 0 shows progress: N ranks drawing on one terminal would be noise.
    with StderrProgress(quiet=args.quiet, shown=launch.rank == 0) as progress:
        selection = select_environment(args.python, quiet=args.quiet or launch.rank != 0)
        snapshot = collect(probe_options(args, selection), progress)
        timeout = args.timeout or (DEFAULT_DIR_TIMEOUT_S if args.dir else DEFAULT_NET_TIMEOUT_S)
        if launch.launched and launch.world_size > 1:
            progress.step(f"waiting for the snapshots of {launch.world_size - 1} other rank(s) "
                          f"(at most {timeout:g} s)")
        notes: list[str] = []
        if not launch.launched:
            notes.append("RANK/WORLD_SIZE are not set: a fleet of one (run under torchrun, or "
                         "set them, to snapshot every rank)")
            items: list[dict[str, Any]] | None = [entry(snapshot, launch)]
            if args.dir:
                gather_dir(snapshot, launch, Path(args.dir), timeout)
        elif args.dir:
            items = gather_dir(snapshot, launch, Path(args.dir), timeout)
        else:
            items = gather_net(snapshot, launch, os.environ, timeout)
    if items is None:  # not rank 0: rank 0 reports
        return ExitCode.OK
    doc = {"schema": FLEET_SCHEMA, "world_size": launch.world_size, "snapshots": items}
    if args.output:
        destination = Path(args.output)
    elif args.dir:
        destination = Path(args.dir) / "fleet.json"
    else:
        destination = _default_fleet_path()
    write_text_atomic(destination, json.dumps(doc, sort_keys=True, indent=2,
                                              ensure_ascii=True) + "\n",
                      state_root=None if args.output else Path(args.dir) if args.dir
                      else Path.cwd())
    if not args.output:
        note(f"fleet document written to {destination}")
    members = members_from_document(destination.name, doc)
    if len(members) == 1:
        notes.append("one snapshot only: nothing to compare")
    report = analyse(members, ignored_variables=args.ignore_env, notes=notes)
    if not args.quiet:
        show(report, args.format)
    return ExitCode.OK if report.equivalent else ExitCode.DRIFT
