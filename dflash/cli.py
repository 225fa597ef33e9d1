"""``dflash-train``: the trainer's console script, guarded by envguard.

It refuses to start unless its environment matches ``lockfiles/dflash-train.toml``.
Launched through ``envguard run`` it trusts the check that already happened (the
``ENVGUARD_VERIFIED`` variable names this lock); launched directly it runs the same
check itself. ``--unguarded`` starts anyway and writes the mismatch into the run's
metadata. The training loop itself lands with issue 5; until then this entry point
checks, reports and exits.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from datetime import datetime, timezone
from pathlib import Path

LOCK_NAME = "dflash-train"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dflash-train",
        description="Train a DFlash drafter. The environment is checked against "
        "lockfiles/dflash-train.toml first.")
    parser.add_argument("--unguarded", action="store_true",
                        help="start even if the environment does not match its lock")
    parser.add_argument("--out", default="runs/dflash", metavar="DIR",
                        help="run folder (metadata.json goes here)")
    return parser


def verify_environment() -> tuple[bool, list[str], str]:
    """(passed, finding titles, how it was checked) for this interpreter's environment."""
    verified = os.environ.get("ENVGUARD_VERIFIED", "")
    if verified.split(":", 1)[0] == LOCK_NAME:
        return True, [], f"verified by envguard run ({verified})"
    from envguard.gate import check, find_lock, project_root_of, read_lock
    from envguard.probe import SnapshotOptions, collect

    path = find_lock(LOCK_NAME, Path.cwd())
    lock = read_lock(path)
    root = project_root_of(path)
    names = {p.name for e in lock.entries for p in e.packages}
    snapshot = collect(SnapshotOptions(
        file_patterns=tuple(str(root / p) for p in lock.file_patterns), cwd=root,
        use_project_config=False, write_cache_marker=False, integrity_only=frozenset(names)))
    result = check(snapshot, lock, str(path), root)
    mismatch = [] if result.passed else [f"[{f.rule}] {f.title}" for f in result.findings]
    return result.passed, mismatch, f"checked {path}"


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        passed, findings, how = verify_environment()
    except Exception as exc:  # noqa: BLE001 - the gate's own errors are one line too
        print(f"dflash-train: cannot check the environment: {exc}", file=sys.stderr)
        return 2
    if not passed and not args.unguarded:
        for line in findings:
            print(f"dflash-train: {line}", file=sys.stderr)
        print("dflash-train: refusing to start: the environment does not match its lock "
              "(envguard check dflash-train explains; --unguarded starts anyway)",
              file=sys.stderr)
        return 3
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = {"started_at": datetime.now(timezone.utc).isoformat(), "guard": how,
            "unguarded": not passed, "mismatch": findings}
    (out / "metadata.json").write_text(json.dumps(meta, indent=2) + "\n")
    state = "environment verified" if passed else "UNGUARDED: environment does not match"
    print(f"dflash-train: {state} ({how}); the training loop lands with issue 5.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
