#!/usr/bin/env bash
# The snapshot benchmark and real snapshots on the GPU machine, in one call.
# Usage (repo root): OUT=/some/dir bash benchmarks/gpu_snapshot.sh [path/to/uv]
# envguard runs from the source tree (PYTHONPATH=repo); the GPU image has packaging,
# rich and psutil. uv is optional (a gzipped binary can be passed as $1).
set -uo pipefail
OUT="${OUT:?set OUT to a results folder}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
PY="$(command -v python3)"
UV_ARGS=()
if [ -n "${1:-}" ] && [ -f "$1" ]; then
    mkdir -p /tmp/uvbin && gunzip -c "$1" > /tmp/uvbin/uv && chmod +x /tmp/uvbin/uv
    UV_ARGS=(--uv /tmp/uvbin/uv)
fi
{
    date -u; hostname; nproc; "$PY" --version; sha256sum --version | head -1
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
} > "$OUT/machine.txt" 2>&1

# Real snapshots of this machine (the incident's torch build) for the diff tests.
PYTHONPATH=. "$PY" -m envguard snapshot -o "$OUT/h200-default.json" 2> "$OUT/h200-default.txt"
PYTHONPATH=. "$PY" -m envguard snapshot --deep -q -o "$OUT/h200-deep.json"

PYTHONPATH=. "$PY" benchmarks/bench_snapshot.py --python "$PY" --envguard-src . \
    "${UV_ARGS[@]}" --reps 5 --warmup 1 --collect-env-reps 3 \
    --json "$OUT/bench.json" --markdown > "$OUT/bench.md" 2> "$OUT/bench.err"
echo "bench exit $?"
cat "$OUT/bench.md"

# envguard diff on ~300 distributions (in-process and CLI).
PYTHONPATH=. "$PY" benchmarks/bench_diff.py --json "$OUT/diff.json" > "$OUT/diff.md" 2>&1
cat "$OUT/diff.md"

# The gate against the bundled lock's h200-cu130 entry (issue 4).
PYTHONPATH=. "$PY" -m envguard check dflash-train > "$OUT/gate-check.txt" 2>&1
echo "check exit $?" >> "$OUT/gate-check.txt"
PYTHONPATH=. "$PY" benchmarks/bench_gate.py --python "$PY" --json "$OUT/gate.json" \
    > "$OUT/gate.md" 2>&1
cat "$OUT/gate-check.txt" "$OUT/gate.md"
