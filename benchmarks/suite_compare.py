"""Compare two runs of the test suite test by test: which time went to the tests both
commits have, and which to the tests only one has.

Each input is the output of a pytest run with ``--durations=0`` (for README's command:
``PYTEST_ADDOPTS=--durations=0 bash .ci/run > run.log``). The tests moved between folders
when the suite was made to mirror the packages, so tests are matched by their name inside
the file (``test_x[param]``), not by path; a name that several files share is summed.
A session fixture's setup counts for the first test that asks for it, in either run.

    python benchmarks/suite_compare.py BEFORE.log AFTER.log [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

LINE = re.compile(r"^(\d+(?:\.\d+)?)s (setup|call|teardown)\s+(\S+)")
TOTAL = re.compile(r"=+ (.*) in (\d+(?:\.\d+)?)s")


def read(path: Path) -> tuple[dict[str, float], dict[str, str], str]:
    """Seconds per test name, the file each name was seen in, pytest's summary line."""
    seconds: dict[str, float] = defaultdict(float)
    where: dict[str, str] = {}
    summary = ""
    with path.open(encoding="utf-8", errors="replace") as f:
        for line in f:
            m = LINE.match(line)
            if m:
                file, _, name = m.group(3).partition("::")
                seconds[name or file] += float(m.group(1))
                where.setdefault(name or file, file)
            elif TOTAL.search(line) and ("passed" in line or "failed" in line):
                summary = line.strip("= \n")
    return seconds, where, summary


def compare(before: Path, after: Path) -> dict[str, Any]:
    old, _, old_summary = read(before)
    new, new_where, new_summary = read(after)
    common = sorted(set(old) & set(new))
    added = sorted(set(new) - set(old))
    by_file: dict[str, float] = defaultdict(float)
    for name in added:
        by_file[new_where[name]] += new[name]
    slowest = sorted(by_file.items(), key=lambda kv: -kv[1])[:20]
    return {
        "before": {"summary": old_summary, "seconds": round(sum(old.values()), 1)},
        "after": {"summary": new_summary, "seconds": round(sum(new.values()), 1)},
        "common": {"tests": len(common), "before_s": round(sum(old[n] for n in common), 1),
                   "after_s": round(sum(new[n] for n in common), 1)},
        "only_before": {"tests": len(set(old) - set(new)),
                        "seconds": round(sum(old[n] for n in set(old) - set(new)), 1)},
        "only_after": {"tests": len(added), "seconds": round(sum(new[n] for n in added), 1),
                       "by_file": {f: round(s, 1) for f, s in slowest}},
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("before", type=Path)
    p.add_argument("after", type=Path)
    p.add_argument("--json", type=Path, help="also write the comparison here")
    args = p.parse_args(argv)
    result = compare(args.before, args.after)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    c, b, a = result["common"], result["only_before"], result["only_after"]
    print(f"before: {result['before']['summary']}")
    print(f"after:  {result['after']['summary']}")
    print(f"tests in both: {c['tests']}: {c['before_s']} s before, "
          f"{c['after_s']} s after")
    print(f"only before: {b['tests']} tests, {b['seconds']} s")
    print(f"only after:  {a['tests']} tests, {a['seconds']} s")
    for file, s in a["by_file"].items():
        print(f"  {s:7.1f} s  {file}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
