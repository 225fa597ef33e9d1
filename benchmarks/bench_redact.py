"""Redaction of a whole snapshot, this tree against a git ref in one run.

    python benchmarks/bench_redact.py --ref bcf2beb --reps 4

Each rep runs a fresh interpreter per tree, in turn (:mod:`abtree`), that reads
``tests/data/h200-snapshot.json`` (the H200 host's snapshot: about 4,600 strings) and
times, best of ``--inner`` calls each: ``suspects`` (the joined search for strings that
may hold a secret), ``redact_text`` on those, and ``redact_snapshot`` as a whole. Printed
as milliseconds and as the ratio this tree / the ref.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from abtree import add_ref_options, alternate, probe, ref_name, trees

SNAPSHOT = Path(__file__).resolve().parents[1] / "tests" / "data" / "h200-snapshot.json"

PROBE = """
import json, sys, time
from envguard import redact
from envguard.model import Snapshot
snap = Snapshot.from_json(open(sys.argv[1], encoding="utf-8").read())
inner = int(sys.argv[2])
strings = []
redact._strings(snap, strings)
found = redact.suspects(strings)
def best(call):
    fastest = float("inf")
    for _ in range(inner):
        start = time.perf_counter()
        call()
        fastest = min(fastest, time.perf_counter() - start)
    return fastest * 1000
print(json.dumps({
    "strings": len(strings), "suspects_found": len(found),
    "suspects_ms": best(lambda: redact.suspects(strings)),
    "redact_text_ms": best(lambda: [redact.redact_text(t) for t in found]),
    "redact_snapshot_ms": best(lambda: redact.redact_snapshot(snap)),
}))
"""

KEYS = ("suspects_ms", "redact_text_ms", "redact_snapshot_ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_ref_options(parser)
    parser.add_argument("--reps", type=int, default=4)
    parser.add_argument("--inner", type=int, default=150)
    args = parser.parse_args()
    with trees(args) as where:
        runs = alternate(where, args.reps, lambda tree, rep: probe(
            tree, PROBE, [str(SNAPSHOT), str(args.inner)], f"rep {rep}"))
    best = {name: {k: min(r[k] for r in results) for k in KEYS} for name, results in runs.items()}
    print(f"{runs['tree'][0]['strings']} strings, {runs['tree'][0]['suspects_found']} suspects "
          f"(ref {ref_name(args)}: {runs['ref'][0]['suspects_found']})")
    for key in KEYS:
        print(f"{key:20} tree {best['tree'][key]:7.2f}  ref {best['ref'][key]:7.2f}  "
              f"ratio {best['tree'][key] / best['ref'][key]:.2f}")
    print(json.dumps({"ref": ref_name(args), "best": best, "runs": runs}))


if __name__ == "__main__":
    main()
