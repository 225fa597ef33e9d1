"""This tree against a git ref in one run: what the A/B benchmarks share.

A benchmark adds :func:`add_ref_options` to its parser, opens :func:`trees` (the ref
checked out with ``git worktree`` into a temporary folder and removed after, or an
existing checkout given with ``--ref-tree``), and calls :func:`alternate`, which runs a
fresh probe process a rep for each tree in turn, so that a slow minute of the machine
hits both. :func:`probe` runs one: ``python -c CODE ARGS`` in the tree, its last stdout
line read as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def add_ref_options(parser: argparse.ArgumentParser) -> None:
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--ref", help="git ref to compare this tree against")
    which.add_argument("--ref-tree", type=Path, metavar="DIR",
                       help="an existing checkout of the ref (where there is no git history, "
                       "as on a machine that gets a copy of the working tree: `git archive "
                       "REF dflash | tar -x -C DIR`)")


def ref_name(args: argparse.Namespace) -> str:
    return str(args.ref or args.ref_tree)


@contextmanager
def trees(args: argparse.Namespace) -> Iterator[dict[str, Path]]:
    """``{"tree": this checkout, "ref": the ref's}`` while the block runs."""
    if args.ref_tree is not None:
        yield {"tree": ROOT, "ref": args.ref_tree.resolve()}
        return
    with tempfile.TemporaryDirectory(prefix="abtree-") as tmp:
        ref_tree = Path(tmp) / "ref"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q",
                        str(ref_tree), args.ref], check=True)
        try:
            yield {"tree": ROOT, "ref": ref_tree}
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force",
                            str(ref_tree)], check=False)


def probe(tree: Path, code: str, argv: Sequence[str], label: str) -> dict[str, Any]:
    """Run ``code`` with ``argv`` in a fresh interpreter importing from ``tree``."""
    proc = subprocess.run([sys.executable, "-c", code, *argv], cwd=tree, capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": str(tree)})
    if proc.returncode != 0:
        raise SystemExit(f"{label}: the probe failed in {tree}:\n{proc.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def alternate(trees: dict[str, Path], reps: int,
              run: Callable[[Path, int], dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """``run(tree, rep)`` ``reps`` times for each tree, the trees taking turns in each rep."""
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in trees}
    for rep in range(reps):
        for name, tree in trees.items():
            runs[name].append(run(tree, rep))
    return runs
