"""Time ``envguard diff`` on two snapshots of ~300 distributions, in-process and as a CLI.

The pair is the incident of tests/incident.py (a real H200 snapshot, rewritten), padded
with synthetic distributions to ``--packages`` (default 300) on both sides, with a
tenth of them changed. The peer is GNU ``diff -u`` over the same two JSON files: the
raw difference, without any explanation.

    python benchmarks/bench_diff.py [--packages 300] [--reps 21] [--json OUT]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from envguard.changes import diff  # noqa: E402
from envguard.explain import explain  # noqa: E402
from envguard.model import Distribution, Snapshot  # noqa: E402
from tests.incident import incident_pair  # noqa: E402


def padded_pair(n: int) -> tuple[Snapshot, Snapshot]:
    good, now = incident_pair()
    extra = max(0, n - len(good.packages))
    fillers = [Distribution(name=f"pkg-{i:04d}", version="1.0.0", location="/site",
                            metadata_dir=f"pkg_{i:04d}-1.0.0.dist-info", installer="uv",
                            fingerprint=f"sha256:{i:064x}", requires=["numpy>=1.0"])
               for i in range(extra)]
    changed = [dataclasses.replace(f, version="1.1.0") if i % 10 == 0 else f
               for i, f in enumerate(fillers)]
    good = dataclasses.replace(good, packages=sorted(good.packages + fillers,
                                                     key=lambda p: p.name))
    now = dataclasses.replace(now, packages=sorted(now.packages + changed,
                                                   key=lambda p: p.name))
    return good, now


def timed(fn: object, reps: int) -> list[float]:
    out = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()  # type: ignore[operator]
        out.append(time.perf_counter() - start)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--packages", type=int, default=300)
    parser.add_argument("--reps", type=int, default=21)
    parser.add_argument("--json", metavar="OUT")
    args = parser.parse_args()
    good, now = padded_pair(args.packages)
    with tempfile.TemporaryDirectory() as tmp:
        a, b = Path(tmp) / "good.json", Path(tmp) / "now.json"
        a.write_text(good.to_json())
        b.write_text(now.to_json())
        texts = a.read_text(), b.read_text()
        in_proc = timed(lambda: explain(good, now, diff(good, now)), args.reps)
        with_load = timed(lambda: explain(*(pair := (Snapshot.from_json(texts[0]),
                                                      Snapshot.from_json(texts[1]))),
                                          diff(*pair)), args.reps)
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        cli = [sys.executable, "-m", "envguard", "diff", str(a), str(b), "--format", "json"]
        peer = ["diff", "-u", str(a), str(b)]
        subprocess.run(cli, capture_output=True, env=env, check=False)  # warm-up
        cli_t = timed(lambda: subprocess.run(cli, capture_output=True, env=env, check=False),
                      max(5, args.reps // 2))
        peer_t = timed(lambda: subprocess.run(peer, capture_output=True, check=False),
                       max(5, args.reps // 2))
    n_findings = len(explain(good, now))
    result = {
        "packages": [len(good.packages), len(now.packages)],
        "changes": len(diff(good, now).changes),
        "findings": n_findings,
        "in_process_diff_explain_ms": 1000 * statistics.median(in_proc),
        "in_process_load_diff_explain_ms": 1000 * statistics.median(with_load),
        "cli_json_s": statistics.median(cli_t),
        "gnu_diff_u_s": statistics.median(peer_t),
        "host": platform.node(), "cpus": os.cpu_count(), "python": platform.python_version(),
        "commands": {"cli": " ".join(cli), "peer": " ".join(peer)},
    }
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    r = result
    print(f"{r['packages']} distributions, {r['changes']} changes, {r['findings']} findings; "
          f"{r['cpus']} CPUs, Python {r['python']}")
    print("| measure | median | bar |\n|---|---|---|")
    print(f"| diff + explain, in-process | {r['in_process_diff_explain_ms']:.2f} ms | ≤ 50 ms |")
    print(f"| load both files + diff + explain, in-process | "
          f"{r['in_process_load_diff_explain_ms']:.1f} ms | (≤ 50 ms) |")
    print(f"| `envguard diff A B --format json` (CLI) | {r['cli_json_s']:.3f} s | ≤ 0.3 s |")
    print(f"| peer: `diff -u A B` | {r['gnu_diff_u_s']:.3f} s | ratio envguard ÷ diff = "
          f"{r['cli_json_s'] / r['gnu_diff_u_s']:.1f}× |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
