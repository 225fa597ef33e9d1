#!/usr/bin/env bash
# The gate's overhead on a GPU host as it comes (fresh) and after it has been used (warm),
# in one call. Usage (repo root): OUT=/some/dir bash benchmarks/gate_fresh_host.sh [TREE]
# TREE: the envguard source tree to time (default: this checkout). Writes, in order:
#   state.txt   what the host holds before the first envguard start (uptime, caches)
#   runs.txt    gated launches one at a time, each timed beside a plain `python -c pass`
#               (the control: what the host itself costs at that moment), in four phases:
#               1 fresh host; 2 warm host after removing envguard's user cache (memo and
#               bytecode); 3 after dropping the kernel's page, dentry and inode caches
#               (where the host allows it); then bench_gate.py --reps 11 as documented
#   gate-1-fresh.json  bench_gate.py right after phase 1
#   gate-2-warm.json   bench_gate.py after phase 3 (the host warm again)
#   gate-3-pyc.json    the same without PYTHONDONTWRITEBYTECODE
set -uo pipefail
OUT="${OUT:?set OUT to a results folder}"
TREE="$(cd "${1:-.}" && pwd)"
mkdir -p "$OUT"
PY="$(command -v python3)"
LOCK="$TREE/lockfiles/dflash-train.toml"
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/envguard"
export PYTHONDONTWRITEBYTECODE=1
{
    date -u; hostname; nproc; "$PY" --version; uptime
    nvidia-smi --query-gpu=name --format=csv,noheader
    echo "envguard user cache $CACHE:"; ls -la "$CACHE" 2>&1 | head -20
} > "$OUT/state.txt" 2>&1

cd "$TREE"
runs() {  # runs PHASE N: N gated launches, each beside a direct one
    echo "--- phase $1: $2 gated launches (envguard run --lock L -- python -c pass) and direct"
    for i in $(seq 1 "$2"); do
        s=$EPOCHREALTIME
        PYTHONPATH="$TREE" "$PY" -m envguard run --lock "$LOCK" --python "$PY" -- "$PY" -c pass \
            > /tmp/gate-run.out 2>&1
        rc=$?
        m=$EPOCHREALTIME
        "$PY" -c pass
        e=$EPOCHREALTIME
        echo "run $i: gated $("$PY" -c "print(f'{$m - $s:.3f}')") s (exit $rc), direct $("$PY" -c "print(f'{$e - $m:.3f}')") s, load $(cut -d' ' -f1 /proc/loadavg)"
        [ "$rc" -ne 0 ] && head -5 /tmp/gate-run.out
    done
}
bench() { PYTHONPATH="$TREE" "$PY" "$TREE/benchmarks/bench_gate.py" --python "$PY" --lock "$LOCK" \
          --reps 11 --json "$OUT/$1" >> "$OUT/runs.txt" 2>&1; }
{
    runs 1 12
} > "$OUT/runs.txt" 2>&1
bench gate-1-fresh.json
{
    rm -rf "$CACHE"
    runs 2 8
    sync
    if echo 3 > /proc/sys/vm/drop_caches 2>/dev/null; then echo "(kernel caches dropped)"
    else echo "(dropping kernel caches not allowed here)"; fi
    runs 3 12
} >> "$OUT/runs.txt" 2>&1
bench gate-2-warm.json
unset PYTHONDONTWRITEBYTECODE
bench gate-3-pyc.json
echo done >> "$OUT/runs.txt"
