#!/usr/bin/env bash
# Same-run A/B of the gate and the snapshot on this VM: git ref BASE against HEAD, both as
# `git archive` trees, alternating for three rounds; raw JSON under $OUT.
# Usage (repo root): BASE=4c10488 OUT=/tmp/ab bash benchmarks/ab_gate_snapshot_vm.sh
# SNAP_PY: the environment snapshotted (default: the CUDA-torch venv README builds).
set -u
: "${BASE:?set BASE to a git ref}" "${OUT:?set OUT to a folder}"
REPO=$(pwd); PY=$REPO/.venv/bin/python; SNAP_PY=${SNAP_PY:-/tmp/fresh2/.venv/bin/python}
WORK=$(mktemp -d); mkdir -p "$OUT" "$WORK/base" "$WORK/head"
git archive "$BASE" | tar -x -C "$WORK/base"
git archive HEAD | tar -x -C "$WORK/head"
for round in 1 2 3; do
  for tree in base head; do
    (cd "$WORK/$tree" && PYTHONDONTWRITEBYTECODE=1 "$PY" benchmarks/bench_gate.py --python "$PY" \
        --lock lockfiles/dflash-train.toml --reps 15 --json "$OUT/gate-$tree-$round.json" >/dev/null 2>&1)
    (cd "$WORK/$tree" && "$PY" benchmarks/bench_snapshot.py --python "$SNAP_PY" \
        --envguard-src "$WORK/$tree" --reps 15 --quick --json "$OUT/snap-$tree-$round.json" >/dev/null 2>&1)
  done
done
rm -rf "$WORK"
