#!/usr/bin/env bash
# A/B of the gate and the snapshot on the GPU host: this tree (.) against .bench-base (an
# older tree unpacked there with git archive), two alternating rounds; results under $OUT.
# Usage (repo root, on the device): OUT=/dir bash benchmarks/ab_gate_snapshot_gpu.sh
set -u
PY="$(command -v python3)"
for r in 1 2; do
 for t in new base; do
  d=.; [ $t = base ] && d=.bench-base
  (cd $d && PYTHONDONTWRITEBYTECODE=1 PYTHONPATH=$PWD "$PY" benchmarks/bench_gate.py --python "$PY" --reps 11 --json $OUT/gate-$t-$r.json > /dev/null 2>&1; echo "gate $t $r $?")
  PYTHONPATH=. "$PY" benchmarks/bench_snapshot.py --python "$PY" --envguard-src $d --reps 9 --quick --json $OUT/snap-$t-$r.json > /dev/null 2>&1; echo "snap $t $r $?"
 done
done
"$PY" - <<'P'
import json,os
o=os.environ["OUT"]
for r in (1,2):
  for t in ("new","base"):
    g=json.load(open(f"{o}/gate-{t}-{r}.json")); s=json.load(open(f"{o}/snap-{t}-{r}.json"))
    res={x['key']:x.get('median_s') for x in s['results']}
    print(r,t,"gate %.3f (min %.3f) exit %s check %.3f | snap %.3f pip %s"%(g['overhead_s'],g['overhead_min_s'],g['gate_exit'],g['check_s'],res['default'],res['pip_freeze']))
P
